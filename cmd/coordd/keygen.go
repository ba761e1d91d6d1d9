package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/internal/base/keyring"
)

// keygenCommand is coordd keygen: a key line for --secret-key-file.
func keygenCommand() *cobra.Command {
	var id string
	cmd := &cobra.Command{
		Use:   "keygen [--id ID]",
		Short: "Print a new key-encryption key for --secret-key-file",
		Long: `Print one line of a secret key file: a key id and 32 random bytes in
base64. The first line of the file is the primary key, which wraps the
namespaces' data keys; later lines only unwrap. Keep the file mode 600 and
give every member the same file.

To rotate: put a new line first on every member (keep the old line), send
each member SIGHUP, run coordctl config rewrap-keys, then remove the old
line and send SIGHUP again. See docs/operations.md.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			line, err := keyring.NewKeyLine(id)
			if err != nil {
				return usageError{err}
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), line)
			return err
		},
	}
	cmd.SetOut(os.Stdout)
	cmd.Flags().StringVar(&id, "id", "k1", "the key's id, recorded with every data key it wraps (1-64 of [A-Za-z0-9._-])")
	return cmd
}
