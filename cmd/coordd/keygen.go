package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/internal/shared/keyring"
)

// keygenCommand is coordd keygen: a key line for --secret-key-file.
func keygenCommand() *cobra.Command {
	var id, out string
	var force bool
	cmd := &cobra.Command{
		Use:   "keygen [--id ID] [--out FILE]",
		Short: "Print a new key-encryption key for --secret-key-file",
		Long: `Print one line of a secret key file: a key id and 32 random bytes in
base64, to standard output or, with --out, to a new file of mode 600.
The first line of the file is the primary key, which wraps the
namespaces' data keys; later lines only unwrap. Keep the file mode 600,
outside any repository, and give every member the same file.

It refuses to write the key into a git work tree (where a commit would
publish it), through --out or a redirected standard output, unless
--force is given.

To rotate: put a new line first on every member (keep the old line), send
each member SIGHUP, run coordctl config rewrap-keys, then remove the old
line and send SIGHUP again. See docs/operations.md.`,
		Example: `  mkdir -p ~/.config/coordd
  coordd keygen --id k1 --out ~/.config/coordd/secret.keys`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			line, err := keyring.NewKeyLine(id)
			if err != nil {
				return usageError{err}
			}
			if out != "" {
				return writeKeyFile(out, line, force)
			}
			w := cmd.OutOrStdout()
			if f, ok := w.(*os.File); ok && !force {
				if err := refuseInWorkTree(filePath(f)); err != nil {
					return err
				}
			}
			_, err = io.WriteString(w, line)
			return err
		},
	}
	cmd.SetOut(os.Stdout)
	cmd.Flags().StringVar(&id, "id", "k1", "the key's id, recorded with every data key it wraps (1-64 of [A-Za-z0-9._-])")
	cmd.Flags().StringVar(&out, "out", "", "write the key to this new file (mode 600) instead of standard output")
	cmd.Flags().BoolVar(&force, "force", false, "write the key even into a git work tree")
	return cmd
}

// writeKeyFile writes line to path, a new file of mode 600, unless path
// is in a git work tree (and not force).
func writeKeyFile(path, line string, force bool) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if !force {
		if err := refuseInWorkTree(abs); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(abs, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s exists; keygen writes a new file (to rotate, put the new line first in the file yourself: see coordd keygen --help)", path)
	}
	if err != nil {
		return err
	}
	if _, err := io.WriteString(f, line); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// filePath is the path f was opened at, also for a standard output the
// shell redirected to a file ("" if it cannot tell, or f is no regular
// file).
func filePath(f *os.File) string {
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return ""
	}
	if p := f.Name(); filepath.IsAbs(p) && !strings.HasPrefix(p, "/dev/") {
		return p
	}
	p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return ""
	}
	return p
}

// refuseInWorkTree fails when path lies in a git work tree: a directory
// above it holds .git.
func refuseInWorkTree(path string) error {
	if path == "" {
		return nil
	}
	for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
			return usageError{fmt.Errorf("%s is in the git work tree %s, where a commit would publish the key; write it elsewhere (for example ~/.config/coordd/secret.keys), or pass --force", path, dir)}
		}
		if parent := filepath.Dir(dir); parent == dir {
			return nil
		}
	}
}
