package configcenter

// SetBeforeWatch makes c call f before each etcd watch it opens. Call it
// before Run.
func SetBeforeWatch(c *Cache, f func()) { c.beforeWatch = f }
