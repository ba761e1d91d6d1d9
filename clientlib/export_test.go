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

// Probed is how many health checks the client has sent to avoided endpoints.
func (c *Client) Probed() int64 { return c.probed.Load() }
