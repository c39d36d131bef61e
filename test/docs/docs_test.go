// Package docs checks the repository's documents: every relative link and
// anchor resolves, and CONTRIBUTING.md's layout names every directory.
package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// repoURL is the repository's address: links to its files on the main
// branch are checked as relative ones.
const repoURL = "https://github.com/dnsops/k8s_event/blob/main/"

// root is the repository's top directory.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("%s is not the repository's top directory: %v", dir, err)
	}
	return dir
}

// documents returns the documents whose links are checked, relative to the
// repository.
func documents(t *testing.T, top string) []string {
	t.Helper()
	docs := []string{"README.md", "CONTRIBUTING.md", "CHANGELOG.md", "BENCHMARKS.md"}
	more, err := filepath.Glob(filepath.Join(top, "docs", "*.md"))
	if err != nil || len(more) == 0 {
		t.Fatalf("no documents in docs/: %v", err)
	}
	for _, m := range more {
		docs = append(docs, filepath.Join("docs", filepath.Base(m)))
	}
	return docs
}

var (
	fenceOpen  = regexp.MustCompile("^\\s*(```|~~~)")
	codeSpan   = regexp.MustCompile("`[^`]*`")
	inlineLink = regexp.MustCompile(`\[([^\]]*)\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	refLink    = regexp.MustCompile(`(?m)^\s*\[[^\]]+\]:\s*(\S+)`)
	heading    = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	htmlTag    = regexp.MustCompile(`<[^>]*>`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// markdown is a document split into its prose (fenced blocks left out)
// and its headings.
type markdown struct {
	prose    []string // lines outside fenced blocks
	headings []string // the text of each ATX heading, in order
}

func parse(text string) markdown {
	var md markdown
	fence := ""
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\n")
		if m := fenceOpen.FindStringSubmatch(line); m != nil {
			switch {
			case fence == "":
				fence = m[1]
				continue
			case m[1] == fence && strings.TrimSpace(line) == fence:
				fence = ""
				continue
			}
		}
		if fence != "" {
			continue
		}
		md.prose = append(md.prose, line)
		if m := heading.FindStringSubmatch(line); m != nil {
			md.headings = append(md.headings, m[2])
		}
	}
	return md
}

// slug is the anchor GitHub gives a heading: its text as rendered, in
// lower case, without punctuation but hyphens and underscores, with a
// hyphen for each space.
func slug(text string) string {
	text = inlineLink.ReplaceAllString(text, "$1")
	text = htmlTag.ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a document: each heading's slug, with -1,
// -2, ... for repeats, as GitHub numbers them, and explicit HTML anchors.
func (md markdown) anchors() map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, h := range md.headings {
		s := slug(h)
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	for _, m := range htmlAnchor.FindAllStringSubmatch(strings.Join(md.prose, "\n"), -1) {
		out[m[1]] = true
	}
	return out
}

// links returns the link targets of a document's prose, code spans left out.
func (md markdown) links() []string {
	prose := codeSpan.ReplaceAllString(strings.Join(md.prose, "\n"), "")
	var out []string
	for _, m := range inlineLink.FindAllStringSubmatch(prose, -1) {
		out = append(out, m[2])
	}
	for _, m := range refLink.FindAllStringSubmatch(prose, -1) {
		out = append(out, m[1])
	}
	return out
}

// checker resolves links against the repository, reading each target
// document once.
type checker struct {
	top  string
	docs map[string]markdown
}

func (c *checker) read(path string) (markdown, error) {
	if md, ok := c.docs[path]; ok {
		return md, nil
	}
	b, err := os.ReadFile(filepath.Join(c.top, path))
	if err != nil {
		return markdown{}, err
	}
	md := parse(string(b))
	c.docs[path] = md
	return md, nil
}

// check tells what is wrong with link, found in the document from (both
// relative to the repository), or "" when it resolves. Links to other
// sites are not followed; links to this repository's main branch are
// checked as relative ones.
func (c *checker) check(from, link string) string {
	link, anchor, hasAnchor := strings.Cut(link, "#")
	var path string
	switch {
	case strings.HasPrefix(link, repoURL):
		path = strings.TrimPrefix(link, repoURL)
	case strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:"):
		return ""
	case link == "":
		path = from
	case strings.HasPrefix(link, "/"):
		return "an absolute path: write it relative to " + from
	default:
		path = filepath.ToSlash(filepath.Join(filepath.Dir(from), link))
	}
	if path == ".." || strings.HasPrefix(path, "../") {
		return "outside the repository"
	}
	info, err := os.Stat(filepath.Join(c.top, path))
	if err != nil {
		return "no such file: " + path
	}
	if !hasAnchor {
		return ""
	}
	if info.IsDir() || !strings.HasSuffix(path, ".md") {
		return "an anchor in something that is not a document: " + path
	}
	md, err := c.read(path)
	if err != nil {
		return err.Error()
	}
	if !md.anchors()[anchor] {
		return "no heading in " + path + " has the anchor #" + anchor
	}
	return ""
}

func TestLinks(t *testing.T) {
	top := root(t)
	c := &checker{top: top, docs: map[string]markdown{}}
	for _, doc := range documents(t, top) {
		md, err := c.read(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, link := range md.links() {
			if why := c.check(doc, link); why != "" {
				t.Errorf("%s: link %s: %s", doc, link, why)
			}
		}
	}
}

// TestRunbookLinks checks that every alert's runbook_url names a heading
// of this repository's documents.
func TestRunbookLinks(t *testing.T) {
	top := root(t)
	c := &checker{top: top, docs: map[string]markdown{}}
	runbook := regexp.MustCompile(`runbook_url:\s*"?([^"\s]+)`)
	for _, file := range []string{"deploy/monitoring/prometheusrule.yaml", "test/e2e/testdata/prometheusrule-tests.yaml"} {
		b, err := os.ReadFile(filepath.Join(top, file))
		if err != nil {
			t.Fatal(err)
		}
		urls := runbook.FindAllStringSubmatch(string(b), -1)
		if len(urls) == 0 {
			t.Errorf("%s has no runbook_url", file)
		}
		for _, m := range urls {
			if !strings.HasPrefix(m[1], repoURL) || !strings.Contains(m[1], "#") {
				t.Errorf("%s: runbook_url %s is not a heading of a document of %s", file, m[1], repoURL)
				continue
			}
			if why := c.check(file, m[1]); why != "" {
				t.Errorf("%s: runbook_url %s: %s", file, m[1], why)
			}
		}
	}
}

// topDirs returns the repository's tracked top-level directories (with
// git; else those on disk but bin and dist, which make writes), dot
// directories left out but .ci, and for each its subdirectories.
func topDirs(t *testing.T, top string) map[string][]string {
	t.Helper()
	var files []string
	cmd := exec.Command("git", "ls-files")
	cmd.Dir = top
	if out, err := cmd.Output(); err == nil {
		files = strings.Fields(string(out))
	} else {
		t.Logf("git ls-files: %v; reading the directory instead", err)
		err := filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(top, path)
			if d.IsDir() && (rel == "bin" || rel == "dist" || rel == ".git") {
				return filepath.SkipDir
			}
			if !d.IsDir() {
				files = append(files, filepath.ToSlash(rel))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	dirs := map[string][]string{}
	for _, f := range files {
		parts := strings.Split(f, "/")
		if len(parts) < 2 || strings.HasPrefix(parts[0], ".") && parts[0] != ".ci" {
			continue
		}
		d := parts[0]
		if _, ok := dirs[d]; !ok {
			dirs[d] = nil
		}
		if len(parts) > 2 && !slices.Contains(dirs[d], parts[1]) {
			dirs[d] = append(dirs[d], parts[1])
		}
	}
	return dirs
}

// TestLayout checks that the Layout section of CONTRIBUTING.md names the
// root package and every tracked top-level directory. A directory with no
// file of its own (cmd, internal, ...) is named by each of its
// subdirectories instead.
func TestLayout(t *testing.T) {
	top := root(t)
	b, err := os.ReadFile(filepath.Join(top, "CONTRIBUTING.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(b), "\n## Layout\n")
	if !ok {
		t.Fatal("CONTRIBUTING.md has no section ## Layout")
	}
	if i := strings.Index(layout, "\n## "); i >= 0 {
		layout = layout[:i]
	}
	if !strings.Contains(layout, "root package") {
		t.Error("CONTRIBUTING.md's layout does not name the root package, the plugin itself")
	}
	var spans []string
	for _, s := range codeSpan.FindAllString(layout, -1) {
		spans = append(spans, strings.Trim(s, "`"))
	}
	named := func(dir string) bool {
		for _, s := range spans {
			if s == dir || s == dir+"/" || strings.HasPrefix(s, dir+"/") {
				return true
			}
		}
		return false
	}
	dirs := topDirs(t, top)
	if len(dirs) == 0 {
		t.Fatal("no directories found")
	}
	for dir, subdirs := range dirs {
		if hasOwnFiles(t, top, dir) {
			if !named(dir) {
				t.Errorf("CONTRIBUTING.md's layout does not name %s/", dir)
			}
			continue
		}
		for _, sub := range subdirs {
			if !named(dir + "/" + sub) {
				t.Errorf("CONTRIBUTING.md's layout does not name %s/%s", dir, sub)
			}
		}
	}
}

// hasOwnFiles tells whether dir holds a tracked file of its own, not only
// directories.
func hasOwnFiles(t *testing.T, top, dir string) bool {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "--", dir+"/*")
	cmd.Dir = top
	out, err := cmd.Output()
	if err != nil {
		entries, err := os.ReadDir(filepath.Join(top, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !e.IsDir() {
				return true
			}
		}
		return false
	}
	for _, f := range strings.Fields(string(out)) {
		if !strings.Contains(strings.TrimPrefix(f, dir+"/"), "/") {
			return true
		}
	}
	return false
}

func TestSlug(t *testing.T) {
	for _, c := range []struct{ heading, want string }{
		{"Upgrading from coredns/k8s_event", "upgrading-from-corednsk8s_event"},
		{"The pod's UID", "the-pods-uid"},
		{"PodDisruptionBudget (opt-in)", "poddisruptionbudget-opt-in"},
		{"Tests, from the fast loop to the real node", "tests-from-the-fast-loop-to-the-real-node"},
		{"`make test` and *k8s_event*", "make-test-and-k8s_event"},
		{"[Install](../README.md#install) here", "install-here"},
	} {
		if got := slug(c.heading); got != c.want {
			t.Errorf("slug(%q) = %q, want %q", c.heading, got, c.want)
		}
	}
	md := parse("# A\n## B\n~~~\n# not a heading\n~~~\n## B\n")
	if a := md.anchors(); !a["a"] || !a["b"] || !a["b-1"] || a["not-a-heading"] {
		t.Errorf("anchors %v, want a, b, b-1", a)
	}
}
