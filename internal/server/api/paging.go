package api

import "fmt"

// List page sizes: of sessions, locks, elections and namespaces; of
// releases, proposals and gray releases (each a larger message).
const (
	defaultPageSize        = 100
	maxPageSize            = 1000
	defaultReleasePageSize = 20
	maxReleasePageSize     = 100
)

// pageSize turns a request's page_size into a limit: the default for zero,
// InvalidArgument outside 1..maxPageSize.
func pageSize(n int32) (int, error) { return pageSizeOf(n, defaultPageSize, maxPageSize) }

// pageSizeOf turns a request's page_size into a limit: def for zero,
// InvalidArgument outside 1..most.
func pageSizeOf(n int32, def, most int) (int, error) {
	switch {
	case n == 0:
		return def, nil
	case n < 0 || int(n) > most:
		return 0, invalid(fmt.Sprintf("page_size must be between 1 and %d", most))
	}
	return int(n), nil
}

// namesPage asks list for one page of names after pageToken (one more
// than the page holds, to know whether another follows) and returns the
// page and the next page's token.
func namesPage(n int32, pageToken string, list func(after string, limit int) ([]string, error)) ([]string, string, error) {
	size, err := pageSize(n)
	if err != nil {
		return nil, "", err
	}
	names, err := list(pageToken, size+1)
	if err != nil || len(names) <= size {
		return names, "", err
	}
	return names[:size], names[size-1], nil
}
