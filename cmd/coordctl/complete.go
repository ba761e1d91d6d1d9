package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/coordd/coordd/clientlib"
)

// Shell completion asks coordd for lock names, election names and config
// namespaces. It fails
// silently: when coordd does not answer within completionTimeout there are
// no completions, and never file names in their place.

// completionTimeout bounds what completing one word may wait for coordd.
const completionTimeout = 2 * time.Second

// lister lists the names that start with prefix.
type lister func(ctx context.Context, c *clientlib.Client, prefix string) ([]string, error)

func lockNames(ctx context.Context, c *clientlib.Client, prefix string) ([]string, error) {
	return c.Admin().ListLocks(ctx, prefix)
}

func electionNames(ctx context.Context, c *clientlib.Client, prefix string) ([]string, error) {
	return c.Admin().ListElections(ctx, prefix)
}

func namespaceNames(ctx context.Context, c *clientlib.Client, prefix string) ([]string, error) {
	return c.ConfigCenter().Namespaces(ctx, prefix)
}

// listCommand lists the names list returns for an optional prefix, one a
// line (a JSON array with -o json).
func (a *app) listCommand(use, short, what string, list lister) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			return a.call(cmd, func(ctx context.Context, c *clientlib.Client) error {
				names, err := list(ctx, c, prefix)
				if err != nil {
					return err
				}
				if names == nil {
					names = []string{}
				}
				return a.print(names, func(w *bytes.Buffer) {
					if len(names) == 0 {
						// A sentence, as every listing prints on an empty
						// result (json: []).
						if prefix != "" {
							fmt.Fprintf(w, "no %s under %q\n", what, prefix)
						} else {
							fmt.Fprintf(w, "no %s\n", what)
						}
					}
					for _, n := range names {
						fmt.Fprintln(w, n)
					}
				})
			})
		},
	}
}

// completeFirst completes a command's first argument from the server; the
// arguments after it get rest (ShellCompDirectiveDefault, file names, for
// the command run runs).
func (a *app) completeFirst(list lister, rest cobra.ShellCompDirective) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, rest
		}
		return a.serverNames(cmd, list, toComplete), cobra.ShellCompDirectiveNoFileComp
	}
}

// completeEach completes every argument from the server, leaving out those
// already given.
func (a *app) completeEach(list lister) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		names := slices.DeleteFunc(a.serverNames(cmd, list, toComplete), func(n string) bool { return slices.Contains(args, n) })
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// serverNames lists names from coordd, or nothing if it does not answer in
// time.
func (a *app) serverNames(cmd *cobra.Command, list lister, prefix string) []string {
	ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
	defer cancel()
	c, err := a.connect(ctx)
	if err != nil {
		return nil
	}
	names, err := list(ctx, c, prefix)
	if err != nil {
		return nil
	}
	return names
}
