package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/coordd/coordd/clientlib"
)

// benchConsole measures the web console against a daemon holding 1,000
// locks (on 10 sessions) and 100 namespaces of 20 keys: its page weight,
// and for each page the time from navigation to the page showing its data
// (3 loads each, in headless Chromium). It needs chromium (or
// chromium-browser, google-chrome) on PATH, and is skipped without one.
func benchConsole(bin, tmp string) error {
	browser := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			browser = p
			break
		}
	}
	if browser == "" {
		fmt.Printf("\nconsole: skipped (no chromium on PATH)\n")
		return nil
	}
	d, err := startDaemon(bin, filepath.Join(tmp, "console"))
	if err != nil {
		return err
	}
	defer d.stop()
	ctx := context.Background()
	c, err := clientlib.New(ctx, clientlib.Config{Endpoints: []string{d.grpcAddr}})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	const locks, sessions, namespaces, keys = 1000, 10, 100, 20
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for i := range sessions {
		s, err := c.NewSession(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = s.Close(context.Background()) }()
		wg.Go(func() {
			for j := i; j < locks; j += sessions {
				if _, err := s.Lock(ctx, fmt.Sprintf("orders/%04d", j)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	for i := range namespaces {
		var ms []clientlib.ConfigMutation
		for k := range keys {
			ms = append(ms, clientlib.ConfigMutation{Key: fmt.Sprintf("key%02d", k), Value: fmt.Sprintf(`{"n":%d,"service":"svc-%d"}`, k, i)})
		}
		if _, err := c.ConfigCenter().Publish(ctx, fmt.Sprintf("svc/%03d", i), ms, clientlib.PublishOptions{}); err != nil {
			return err
		}
	}

	base := "http://" + d.httpAddr + "/ui/"
	raw, gz := 0, 0
	for _, asset := range []string{"", "app.js", "style.css", "icon.svg"} {
		resp, err := http.Get(base + asset)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return err
		}
		var b bytes.Buffer
		w, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
		_, _ = w.Write(body)
		_ = w.Close()
		raw, gz = raw+len(body), gz+b.Len()
	}

	profile, err := os.MkdirTemp(tmp, "chromium")
	if err != nil {
		return err
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.UserDataDir(profile), chromedp.WindowSize(1280, 860))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	// Start the browser on bctx itself: the first run's context owns it.
	if err := chromedp.Do(bctx); err != nil {
		return fmt.Errorf("start %s: %w", browser, err)
	}
	pages := []struct{ name, route, ready string }{
		{"overview", "#/", `document.querySelector('[data-metric="coordd_locks_held"]')?.innerText.replace(/\D/g, '') === '1000' && document.querySelector('main table') !== null`},
		{"sessions", "#/sessions", `document.querySelectorAll('main tbody tr').length >= 10`},
		{"locks (first 100)", "#/locks", `document.querySelectorAll('main tbody tr').length >= 100`},
		{"one lock", "#/locks/orders/0500", `document.querySelector('main table code') !== null`},
		{"namespaces", "#/config", `document.querySelectorAll('main tbody tr').length >= 100`},
		{"a snapshot (20 keys)", "#/config/svc/050", `document.querySelectorAll('main tbody tr').length >= 20`},
	}
	fmt.Printf("\nweb console (%d locks on %d sessions, %d namespaces of %d keys; headless Chromium, 3 fresh loads per page)\n", locks, sessions, namespaces, keys)
	fmt.Printf("  page weight: %.1f KiB (%.1f KiB gzipped; served uncompressed), no other requests but the API's\n", float64(raw)/1024, float64(gz)/1024)
	fmt.Printf("%-24s %s\n", "page", "time to its data shown (ms)")
	for _, p := range pages {
		var times []string
		for range 3 {
			tctx, tcancel := context.WithTimeout(bctx, 30*time.Second)
			err := chromedp.Do(tctx, chromedp.Navigate("about:blank"), chromedp.Navigate(base+p.route),
				chromedp.WaitVisible(chromedp.CSS(`main h1`)), chromedp.Poll[chromedp.Void](p.ready, chromedp.WithPollingInterval(5*time.Millisecond), chromedp.WithPollingTimeout(25*time.Second)))
			if err != nil {
				tcancel()
				return fmt.Errorf("console %s: %w", p.name, err)
			}
			ms, err := chromedp.Run(tctx, chromedp.Evaluate[float64](`performance.now()`))
			tcancel()
			if err != nil {
				return err
			}
			times = append(times, fmt.Sprintf("%.0f", ms))
		}
		fmt.Printf("%-24s %s\n", p.name, strings.Join(times, " / "))
	}
	return nil
}
