package clientlib

// Avoid is avoid, for the external tests: it leaves endpoint out as a
// failed keep-alive would.
func (c *Client) Avoid(endpoint string) { c.avoid(endpoint, false) }

// Avoided reports whether endpoint is left out now.
func (c *Client) Avoided(endpoint string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.avoided[endpoint]
	return ok
}

// FollowStream is the server's id of the stream on which s's holdings are
// named (0 until its first renewal named them).
func (s *Session) FollowStream() uint64 { return s.followStream().stream }

// MoveTo is prefer, for the external tests: it moves the client from the
// endpoint it uses to endpoint as finding the member that leads etcd there
// would.
func (c *Client) MoveTo(endpoint, from string) { c.prefer(endpoint, from) }
