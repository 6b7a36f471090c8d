"""The project's own documentation holds together: every relative link of
the README and docs/ leads to a file (and a heading), every setting of
shim/config/settings.def is in docs/policy.md, every function of the C API in
docs/c-api.md, every metric in docs/metrics.md (test_metrics), the journal's
tables are what events.def makes (test_journal_schema); and no file of the
project cites a document the project does not contain."""
import os
import re
import subprocess
import unittest

from gg import ROOT

PAGES = (["README.md", "tools/README.md"]
         + sorted("docs/" + n for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md"))
         + sorted("tests/%s/README.md" % d for d in os.listdir(os.path.join(ROOT, "tests"))
                  if os.path.isfile(os.path.join(ROOT, "tests", d, "README.md"))))


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def prose(text):
    """The text outside fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def anchors(text):
    """GitHub's anchors of a page's headings."""
    out = set()
    for m in re.finditer(r"^#+\s+(.*)$", prose(text), re.M):
        t = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
        out.add(t.replace(" ", "-"))
    return out


class Docs(unittest.TestCase):
    def test_every_relative_link_leads_somewhere(self):
        bad = []
        for page in PAGES:
            text = read(page)
            for m in re.finditer(r"\[[^\]]*\]\(([^)\s]+)\)", prose(text)):
                link = m.group(1)
                if re.match(r"[a-z]+:", link):
                    continue
                path, _, frag = link.partition("#")
                target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                if not os.path.exists(os.path.join(ROOT, target)):
                    bad.append("%s: %s: no such file" % (page, link))
                elif frag and target.endswith(".md") and frag not in anchors(read(target)):
                    bad.append("%s: %s: no heading #%s in %s" % (page, link, frag, target))
        self.assertEqual(bad, [])

    def test_every_setting_is_documented(self):
        policy = read("docs/policy.md")
        rows = re.findall(r'^SETTING\((\w+),\s*(\w+),\s*"([^"]*)",\s*(NULL|"[^"]*")',
                          read("shim/config/settings.def"), re.M)
        self.assertTrue(rows)
        missing = []
        for field, section, key, env in rows:
            if key and "| `%s` |" % key not in policy:
                missing.append("[%s] %s" % (section, key))
            if env != "NULL" and "`%s`" % env.strip('"') not in policy:
                missing.append(env.strip('"'))
        self.assertEqual(missing, [], "settings.def rows docs/policy.md does not describe")

    def test_every_c_api_function_is_documented(self):
        header = read("include/gpuguard.h")
        shim_part = header[header.index("#ifdef GPUGUARD_SHIM"):header.index("#else")]
        names = set(re.findall(r"\b(gpuguard_\w+)\(", shim_part))
        self.assertIn("gpuguard_policy", names)
        capi = read("docs/c-api.md")
        for n in sorted(names):
            self.assertRegex(capi, r"\*\*`[^`]*\b%s\(" % n, "docs/c-api.md does not describe " + n)

    def test_no_file_cites_a_document_the_project_does_not_have(self):
        try:
            files = subprocess.run(["git", "ls-files"], cwd=ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True, check=True).stdout.split()
        except (OSError, subprocess.CalledProcessError):
            self.skipTest("not a git checkout: the tracked files are unknown")
        cites = []
        for rel in files:
            path = os.path.join(ROOT, rel)
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError):
                continue
            for n, line in enumerate(text.splitlines(), 1):
                if re.search(r"DESIGN\.md|\.\./shared|\bseeds/\d", line):
                    cites.append("%s:%d" % (rel, n))
        self.assertEqual(cites, [])


if __name__ == "__main__":
    unittest.main()
