// Package console serves coordd's web console: a few static files embedded
// in the binary (assets/), served under /ui/ on the HTTP listener.
//
// The console is a client of the public REST API and nothing else: every
// view reads and every button writes through the same /v1/ routes that curl
// and coordctl use, with the same bearer token, so it can do nothing a
// principal could not do with curl, and the policy decides what it shows.
// The files hold no data and need no identity; they are the same for every
// user. Nothing is fetched from another origin: the Content-Security-Policy
// sent with every file allows this origin only.
//
// URLs inside the console are relative, so it works behind a reverse proxy
// that serves coordd under a path prefix (/coordd/ui/ → /ui/).
package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed assets
var assets embed.FS

// securityHeaders go with every file: scripts, styles, images and API calls
// from this origin only; never framed; no referrer leaves the page.
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
	"X-Content-Type-Options":  "nosniff",
	"Referrer-Policy":         "no-referrer",
	"X-Frame-Options":         "DENY",
}

type file struct {
	body  []byte
	etag  string
	ctype string
}

// Handler serves the console's files. Mount it under /ui/ with the prefix
// stripped (http.StripPrefix("/ui", console.Handler())): "/" is the
// console's page; anything not a file is 404. Files are revalidated on every
// load (ETag, Cache-Control: no-cache), so an upgraded daemon's console is
// never mixed with an old one's cached scripts.
func Handler() http.Handler {
	files := map[string]file{}
	err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := assets.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		ctype := mime.TypeByExtension(path.Ext(p))
		if ctype == "" {
			ctype = "application/octet-stream"
		}
		files[strings.TrimPrefix(p, "assets")] = file{body: body, etag: `"` + hex.EncodeToString(sum[:8]) + `"`, ctype: ctype}
		return nil
	})
	if err != nil {
		panic("console: embedded assets unreadable: " + err.Error()) // a build defect, found by any test
	}
	files["/"] = files["/index.html"]
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		for k, v := range securityHeaders {
			h.Set(k, v)
		}
		h.Set("Content-Type", f.ctype)
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", f.etag)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.body))
	})
}
