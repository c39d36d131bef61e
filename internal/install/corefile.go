package install

import (
	"fmt"
	"slices"
	"strings"

	"github.com/coredns/caddy/caddyfile"
	"github.com/coredns/corefile-migration/migration/corefile"
)

// AddPlugins returns the Corefile with kubeapi and k8s_event added to every
// server block that has the kubernetes plugin (or to the first server block
// when none has it), and whether it changed anything. Every other server
// block, plugin and option stays as it was. k8s_event gets block as its
// options (e.g. "level info warning error"), or none for its defaults.
// Blocks that already have kubeapi or k8s_event keep theirs, and every
// k8s_event block takes the options given: each replaces the line of the
// same property.
//
// The Corefile is parsed with the parser kubeadm migrates Corefiles with
// (github.com/coredns/corefile-migration) and written back in its layout:
// comments do not survive, and a Corefile nested deeper than plugin
// options is refused, as that parser would lose it.
func AddPlugins(text string, options []string) (string, bool, error) {
	cf, err := parseCorefile(text)
	if err != nil {
		return "", false, err
	}
	var targets []*corefile.Server
	for _, s := range cf.Servers {
		if isSnippet(s) {
			continue
		}
		if slices.ContainsFunc(s.Plugins, named("kubernetes")) {
			targets = append(targets, s)
		}
	}
	if len(targets) == 0 {
		for _, s := range cf.Servers {
			if !isSnippet(s) {
				targets = append(targets, s)
				break
			}
		}
	}
	if len(targets) == 0 {
		return "", false, fmt.Errorf("the Corefile has no server block")
	}
	changed := false
	for _, s := range targets {
		if !slices.ContainsFunc(s.Plugins, named("kubeapi")) {
			s.Plugins = append(s.Plugins, &corefile.Plugin{Name: "kubeapi"})
			changed = true
		}
		if !slices.ContainsFunc(s.Plugins, named("k8s_event")) {
			s.Plugins = append(s.Plugins, &corefile.Plugin{Name: "k8s_event"})
			changed = true
		}
	}
	// Every k8s_event block takes the options: a property it has already
	// is replaced, in its place; the settings are process-wide, so blocks
	// that differ would conflict.
	for _, s := range cf.Servers {
		for _, p := range s.Plugins {
			if p.Name != "k8s_event" {
				continue
			}
			for _, o := range options {
				f := strings.Fields(o)
				if len(f) == 0 {
					continue
				}
				i := slices.IndexFunc(p.Options, func(have *corefile.Option) bool { return have.Name == f[0] })
				switch {
				case i < 0:
					p.Options = append(p.Options, &corefile.Option{Name: f[0], Args: f[1:]})
					changed = true
				case !slices.Equal(p.Options[i].Args, f[1:]):
					p.Options[i].Args = f[1:]
					changed = true
				}
			}
		}
	}
	if !changed {
		return text, false, nil
	}
	return format(cf), true, nil
}

// format writes cf as corefile.Corefile.ToString does, except that a
// server block or snippet with nothing in it keeps its braces, which
// ToString drops (and without them the next block's key is read as its
// content). A top-level import has none.
func format(cf *corefile.Corefile) string {
	strs := make([]string, 0, len(cf.Servers))
	for _, s := range cf.Servers {
		out := s.ToString()
		if len(s.Plugins) == 0 && (len(s.DomPorts) == 0 || s.DomPorts[0] != "import") {
			out += " {\n}\n"
		}
		strs = append(strs, out)
	}
	return strings.Join(strs, "\n")
}

// HasPlugins reports whether any server block of the Corefile has
// k8s_event.
func HasPlugins(text string) bool {
	cf, err := parseCorefile(text)
	if err != nil {
		return false
	}
	for _, s := range cf.Servers {
		if slices.ContainsFunc(s.Plugins, named("k8s_event")) {
			return true
		}
	}
	return false
}

func named(name string) func(*corefile.Plugin) bool {
	return func(p *corefile.Plugin) bool { return p.Name == name }
}

// isSnippet reports whether s is a snippet, "(name) { ... }", which
// server blocks import.
func isSnippet(s *corefile.Server) bool {
	return len(s.DomPorts) == 1 && strings.HasPrefix(s.DomPorts[0], "(") && strings.HasSuffix(s.DomPorts[0], ")")
}

// parseCorefile parses text after checking that its blocks nest no deeper
// than the parser keeps, and that its braces balance.
func parseCorefile(text string) (*corefile.Corefile, error) {
	d := caddyfile.NewDispenser("Corefile", strings.NewReader(text))
	depth := 0
	for d.Next() {
		switch d.Val() {
		case "{":
			depth++
			if depth > 2 {
				return nil, fmt.Errorf("Corefile:%d: a block nested inside a plugin's options; edit this Corefile by hand", d.Line())
			}
		case "}":
			depth--
			if depth < 0 {
				return nil, fmt.Errorf("Corefile:%d: unexpected }", d.Line())
			}
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("Corefile: %d unclosed blocks", depth)
	}
	cf, err := corefile.New(text)
	if err != nil {
		return nil, fmt.Errorf("Corefile: %w", err)
	}
	return cf, nil
}
