"""Stacks: near misses, refusals, OOMs and the peak carry the native
call stack that caused them."""
from gg import GiB, MiB, Case

POLICY = """\
[gpu]
match = NVIDIA GeForce RTX 3090*
[memory]
headroom = 2 GiB
near_miss = 5%
mode = enforce
[journal]
stacks = {stacks}
depth = {depth}
"""


class Stacks(Case):
    def policy(self, stacks="near_miss", depth=32):
        return self.write_policy("p.ini", POLICY.format(stacks=stacks, depth=depth))

    def test_incidents_name_the_caller_first(self):
        run = self.api("fill", "1G", policy=self.policy())
        events = run.of("near_miss") + run.of("refused")
        self.assertEqual(len(events), 3)
        for e in events:
            first = e["stack"][0]
            self.assertEqual(first["sym"], "fill_step", e["stack"][:3])
            self.assertTrue(first["module"].endswith("/api"))
            self.assertTrue(first["ip"].startswith("0x"))
            self.assertIsInstance(first["off"], int)
            self.assertIn("main", [f["sym"] for f in e["stack"]])
            self.assertFalse(any("libgpuguard" in (f["module"] or "") for f in e["stack"]))

    def test_oom_carries_a_stack(self):
        run = self.script("alloc:1G", "alloc:1G", FAKECUDA_FAIL_ALLOC="2",
                          policy=self.policy())
        (oom,) = run.of("oom")
        self.assertEqual(oom["stack"][0]["sym"], "main")

    def test_one_site_stored_for_a_thousand_calls(self):
        run = self.api("repeat", "1000", policy=self.policy("all"))
        summary = run.one("summary")
        self.assertEqual(summary["sites"], 1)
        self.assertEqual(summary["devices"][0]["allocs"], 1000)

    def test_peak_stack_and_peak_sites(self):
        run = self.api("sites", policy=self.policy("all"))
        s = run.summary()
        self.assertEqual(s["peak"], 2 * GiB + 512 * MiB)
        self.assertEqual(s["peak_stack"][0]["sym"], "site_b")  # the allocation that set it
        sites = s["peak_sites"]
        self.assertEqual([(x["stack"][0]["sym"], x["bytes"], x["allocs"]) for x in sites],
                         [("site_a", 2 * GiB, 2), ("site_b", 512 * MiB, 1)])

    def test_peak_sites_without_stacks_per_allocation(self):
        # stacks = near_miss: what has no stack is one unattributed entry
        run = self.api("sites", policy=self.policy("near_miss"))
        s = run.summary()
        self.assertEqual(s["peak_stack"][0]["sym"], "site_b")
        self.assertEqual(sum(x["bytes"] for x in s["peak_sites"]), s["peak"])

    def test_stacks_off(self):
        run = self.api("fill", "1G", policy=self.policy("off"))
        self.assertEqual(run.one("refused")["stack"], [])
        self.assertEqual(run.summary()["peak_stack"], [])
        self.assertEqual(run.one("summary")["sites"], 0)

    def test_depth(self):
        run = self.api("fill", "1G", policy=self.policy(depth=2))
        self.assertEqual([f["sym"] for f in run.one("refused")["stack"]], ["fill_step", "fill"])

    def test_threads_with_every_stack(self):
        run = self.script("threads:16:2000:1M", policy=self.policy("all"))
        s = run.summary()
        self.assertEqual((s["allocs"], s["frees"], s["live_bytes"]), (16 * 2001, 16 * 2001, 0))
        self.assertLessEqual(run.one("summary")["sites"], 4)
        self.sanitizer_clean(run)
