"""Tests of offloadd.plan against the vectors shared with the C++ planner.

Run: /usr/bin/python3 -m unittest discover -s client/python/tests -p 'test_plan.py'
Vectors: client/plan/testdata/plan_vectors.json (also read by //client/plan:planner_test).
"""

import dataclasses
import json
import os
import sys
import tempfile
import unittest

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(_ROOT, "client", "python"))

from offloadd import plan as P  # noqa: E402

with open(os.path.join(_ROOT, "client", "plan", "testdata", "plan_vectors.json")) as _f:
    VECTORS = json.load(_f)


def _model(name):
    v = VECTORS["models"][name]
    return P.ModelShape(layers=v["layers"], hidden=v["hidden"],
                        attention_width=v["attention_width"],
                        params_per_layer=v["params_per_layer"], name=name)


def _plan(model, inputs):
    # Optional inputs (plan_vectors.json "about"): absent = the planner's defaults.
    extra = {k: inputs[v] for k, v in (("keep_last_n", "keep_last_n"),
                                        ("gpu_memory_bytes", "gpu_memory"),
                                        ("gpu_peak_bytes", "gpu_peak"), ("tp", "tp"),
                                        ("host_ram_bytes", "host_ram")) if v in inputs}
    return P.plan(model, seq=inputs["seq"], batch=inputs["batch"], dtype=inputs["dtype"],
                  gpus_per_node=inputs["gpus_per_node"], gpus_per_link=inputs["gpus_per_link"],
                  link=inputs["link"], tflops=inputs["tflops"], **extra)


def _quantity(p, key):
    """The plan's figure in the unit the vector key names."""
    return {
        "copy_ms": p.copy_seconds_per_layer * 1e3,
        "forward_ms": p.forward_seconds_per_layer * 1e3,
        "sync_slowdown_pct": p.sync_slowdown * 100,
        "overlap_slowdown_pct": p.overlap_slowdown * 100,
        "copy_to_forward_pct": p.copy_to_forward_ratio * 100,
        "checkpoint_bytes_per_layer": p.checkpoint_bytes_per_layer,
        "checkpoint_bytes_per_gpu": p.checkpoint_bytes_per_gpu,
        "pinned_host_bytes_per_node": p.pinned_host_bytes_per_node,
        "checkpoint_gib_per_gpu": p.checkpoint_bytes_per_gpu / 2**30,
        "pinned_host_gib_per_node": p.pinned_host_bytes_per_node / 2**30,
        "full_overlap_min_seq_len": p.full_overlap_min_seq_len,
        "link_gbps": p.link_bytes_per_second / 1e9,
        "offloaded_layers": p.offloaded_layers,
        "offloads_in_flight_at_backward": p.offloads_in_flight_at_backward,
        "gpu_freed_bytes_per_gpu": p.gpu_bytes_freed_per_gpu,
        "gpu_freed_gib_per_gpu": p.gpu_bytes_freed_per_gpu / 2**30,
        "pool_headroom": p.pool_headroom,
        "pool_bytes": p.pool_bytes,
        "pool_bytes_with_headroom": p.pool_bytes_with_headroom,
        "pool_gib": p.pool_bytes / 2**30,
        "checkpoint_pct_of_gpu_memory": (100.0 * p.checkpoint_bytes_per_gpu / p.gpu_memory_bytes
                                         if p.gpu_memory_bytes else float("nan")),
        "gpu_peak_with_offload_min_bytes": p.gpu_peak_with_offload_min_bytes,
    }[key]


class VectorTest(unittest.TestCase):
    def test_cases_match_printed_precision(self):
        self.assertGreaterEqual(len(VECTORS["cases"]), 10)
        for case in VECTORS["cases"]:
            p = _plan(_model(case["model"]), case["inputs"])
            for key, want in case["expect"].items():
                with self.subTest(case=case["name"], key=key):
                    got = _quantity(p, key)
                    tol = 0.5 * 10 ** -want["decimals"] * (1 + 1e-12)
                    self.assertLessEqual(abs(got - want["value"]), tol,
                                         f"{case['name']}: {key} = {got}, want {want['value']}")

    def test_decisions_enable_calls_and_peak_brackets(self):
        counts = {"decision": 0, "call": 0, "bracket": 0}
        for case in VECTORS["cases"]:
            p = _plan(_model(case["model"]), case["inputs"])
            with self.subTest(case=case["name"]):
                if "expect_decision" in case:
                    counts["decision"] += 1
                    self.assertEqual(p.decision, case["expect_decision"])
                if "expect_enable_call" in case:
                    counts["call"] += 1
                    self.assertEqual(P.enable_call(p), case["expect_enable_call"])
                if "measured_peak_with_offload_bytes" in case:
                    counts["bracket"] += 1
                    measured = case["measured_peak_with_offload_bytes"]
                    self.assertLessEqual(p.gpu_peak_with_offload_min_bytes, measured)
                    self.assertGreaterEqual(p.gpu_peak_bytes, measured)
        self.assertGreaterEqual(counts["decision"], 8)
        self.assertGreaterEqual(counts["call"], 2)
        self.assertGreaterEqual(counts["bracket"], 3)
        decided = {c["expect_decision"] for c in VECTORS["cases"] if "expect_decision" in c}
        self.assertEqual(decided, set(P.DECISIONS))

    def test_hf_configs_parse_to_the_vector_models(self):
        for entry in VECTORS["hf_configs"]:
            with self.subTest(file=entry["file"]):
                m = P.model_from_hf_config(os.path.join(_ROOT, entry["file"]))
                want = VECTORS["models"][entry["model"]]
                for key in ("layers", "hidden", "attention_width", "params_per_layer"):
                    self.assertEqual(getattr(m, key), want[key], key)
                for key, value in entry["expect"].items():
                    self.assertEqual(getattr(m, key), value, key)

    def test_cases_through_hf_configs_give_the_same_plan(self):
        by_model = {e["model"]: e["file"] for e in VECTORS["hf_configs"]}
        for case in VECTORS["cases"]:
            if case["model"] not in by_model:
                continue
            m = P.model_from_hf_config(os.path.join(_ROOT, by_model[case["model"]]))
            a = _plan(m, case["inputs"])
            b = _plan(_model(case["model"]), case["inputs"])
            self.assertEqual(a.copy_seconds_per_layer, b.copy_seconds_per_layer)
            self.assertEqual(a.forward_seconds_per_layer, b.forward_seconds_per_layer)

    def test_json_keys(self):
        keys = VECTORS["json_keys"]
        case = VECTORS["cases"][0]
        d = json.loads(P.format_plan_json(_plan(_model(case["model"]), case["inputs"])))
        self.assertEqual(sorted(d), sorted(keys["plan"]))
        self.assertEqual(sorted(d["inputs"]), sorted(keys["inputs"]))
        self.assertEqual(sorted(d["model"]), sorted(keys["model"]))
        self.assertEqual(d["checkpoint_bytes_per_layer"], 33554432)
        self.assertEqual(d["inputs"]["link"], "h200")

    def test_golden_text_matches_cpp(self):
        self.assertGreaterEqual(len(VECTORS["golden_texts"]), 3)
        for g in VECTORS["golden_texts"]:
            with self.subTest(file=g["file"]):
                m = P.model_from_hf_config(os.path.join(_ROOT, g["hf_config"]))
                with open(os.path.join(_ROOT, g["file"])) as f:
                    self.assertEqual(P.format_plan(_plan(m, g["inputs"])), f.read())


class InvalidInputsTest(unittest.TestCase):
    """Inputs both planners refuse with a sentence (plan_vectors.json "invalid_inputs"), and
    tensor parallelism across nodes, which is planned but warned about."""

    def test_each_vector_is_refused_with_its_sentence(self):
        rows = VECTORS["invalid_inputs"]
        self.assertGreaterEqual(len(rows), 6)
        for row in rows:
            model = _model(row["model"])
            if "hidden" in row:
                model = dataclasses.replace(model, hidden=row["hidden"])
            with self.assertRaises(ValueError, msg=row["error"]) as e:
                _plan(model, row["inputs"])
            self.assertIn(row["error"], str(e.exception))

    def test_tp_across_nodes_warns_and_plans(self):
        with self.assertWarns(UserWarning) as w:
            p = P.plan(_model("qwen3-8b"), seq=4096, tp=16, gpus_per_node=8)
        self.assertIn("tp (16) exceeds gpus_per_node (8)", str(w.warning))
        self.assertEqual(p.checkpoint_bytes_per_layer, 4096 // 16 * 4096 * 2)


class PlannerTest(unittest.TestCase):
    def test_formula_pieces(self):
        m = _model("qwen3-8b")
        p = P.plan(m, seq=4096)
        self.assertEqual(p.matmul_flops_per_layer, 2 * 4096 * 192937984)
        self.assertEqual(p.attention_flops_per_layer, 2 * 4096 * 4096 * 4096)
        self.assertAlmostEqual(p.sync_slowdown, 2 * p.copy_seconds_per_layer
                               / (4 * p.forward_seconds_per_layer), places=15)
        self.assertAlmostEqual(p.overlap_budget_seconds, 3 * p.forward_seconds_per_layer,
                               places=15)
        self.assertEqual(p.link_bytes_per_second, 55.43e9)

    def test_link_shared_by_gpus_divides_bandwidth(self):
        m = _model("qwen3-1.7b")
        one = P.plan(m, seq=4096, link="pcie5", gpus_per_link=1)
        four = P.plan(m, seq=4096, link="pcie5", gpus_per_link=4)
        self.assertAlmostEqual(four.copy_seconds_per_layer, 4 * one.copy_seconds_per_layer,
                               places=15)
        self.assertEqual(four.link_bytes_per_second_per_gpu, 63e9 / 4)

    def test_full_overlap_threshold_is_exact(self):
        m = _model("qwen3-1.7b")
        at = P.plan(m, seq=18435, link="pcie4", gpus_per_link=8)
        below = P.plan(m, seq=18434, link="pcie4", gpus_per_link=8)
        self.assertTrue(at.overlaps_fully)
        self.assertEqual(at.overlap_slowdown, 0.0)
        self.assertFalse(below.overlaps_fully)
        self.assertGreater(below.overlap_slowdown, 0.0)

    def test_sweep(self):
        rows = P.sweep(_model("qwen3-8b"))
        self.assertEqual([r.seq_len for r in rows], [1024 << k for k in range(10)])
        self.assertTrue(all(r.overlap_slowdown == 0.0 for r in rows))
        slow = [r.sync_slowdown for r in rows]
        self.assertEqual(slow, sorted(slow, reverse=True))  # [ref]: cheaper as s grows

    def test_links_and_dtypes(self):
        self.assertEqual(P.resolve_link("PCIe4"), ("pcie4", 31e9))
        self.assertEqual(P.resolve_link("nvlink-c2c"), ("nvlink-c2c", 450e9))
        self.assertEqual(P.resolve_link("12.5"), ("custom", 12.5e9))
        self.assertEqual(P.resolve_link(40), ("custom", 40e9))
        self.assertEqual(P.plan(_model("toy-qwen3"), seq=8, dtype="fp16")
                         .checkpoint_bytes_per_layer, 8 * 512 * 2)

    def test_gpu_names_stand_for_their_host_links(self):
        for gpu, link in (("h100", "pcie5"), ("A100", "pcie4"), ("b200", "pcie5"),
                          ("gh200", "nvlink-c2c"), ("h200", "h200")):
            with self.subTest(gpu=gpu):
                name, rate = P.resolve_link(gpu)
                self.assertEqual(name, gpu.lower())
                self.assertEqual(rate, P.LINK_PRESETS[link])
                self.assertEqual(P.host_link(name), link)
        p = P.plan(_model("qwen3-8b"), seq=4096, link="h100")
        self.assertEqual((p.link, p.host_link), ("h100", "pcie5"))
        self.assertIn("link h100 (pcie5) 63.00 GB/s", P.format_plan(p))
        with self.assertRaisesRegex(ValueError, "a GPU \\(h100, a100, b200, gh200, h200\\)"):
            P.resolve_link("v100")

    def test_keep_last_n_and_pool_headroom(self):
        m = _model("qwen3-8b")
        p0 = P.plan(m, seq=4096, keep_last_n=0, gpus_per_node=4)
        p3 = P.plan(m, seq=4096, keep_last_n=3, gpus_per_node=4)
        self.assertEqual(p0.pinned_host_bytes_per_node, 4 * 36 * 33554432)
        self.assertEqual(p3.pinned_host_bytes_per_node, 4 * 33 * 33554432)
        self.assertEqual(p3.gpu_bytes_freed_per_gpu, 33 * 33554432)
        self.assertEqual(p3.checkpoint_bytes_per_gpu, 36 * 33554432)  # unchanged by keep_last_n
        self.assertEqual(p3.pool_bytes, 4 * 33 * 32 * 13 // 10 * 2**20 + 2**20)  # ceil to a MiB
        self.assertEqual(P.pool_headroom(1), 1.05)
        self.assertEqual(P.pool_headroom(2), 1.3)
        self.assertIn("keep_last_n=3", P.enable_call(p3))

    def test_gpu_memory_decisions(self):
        m = _model("qwen3-1.7b")
        kw = dict(seq=32768, keep_last_n=0, gpu_memory_bytes=12 * 10**9)
        self.assertEqual(P.plan(m, **kw, gpu_peak_bytes=12 * 10**9).decision, "not_needed")
        self.assertEqual(P.plan(m, **kw, gpu_peak_bytes=12 * 10**9 + 1).decision, "offload")
        # No peak: it cannot tell whether the run fits, so it does not say "offload".
        self.assertEqual(P.plan(m, **kw).decision, "undecided")
        text = P.format_plan(P.plan(m, **kw))
        self.assertIn("give --gpu-peak to decide", text)
        self.assertIn("decision                     cannot decide  (whether offload is needed: "
                      "without the run's peak the planner cannot tell; pass --gpu-peak SIZE", text)
        self.assertNotIn("decision                     offload", text)
        self.assertIn("pool_bytes: ", text)   # the settings if it is needed
        self.assertIn("pass --gpu-memory SIZE and --gpu-peak SIZE",
                      P.format_plan(P.plan(m, seq=32768)))
        text = P.format_plan(P.plan(m, **kw, gpu_peak_bytes=11130000000))
        self.assertIn("offload not needed", text)
        self.assertNotIn("pool_bytes", text)
        with self.assertRaisesRegex(ValueError, "needs gpu_memory_bytes"):
            P.plan(m, seq=32768, gpu_peak_bytes=10**10)
        with self.assertRaisesRegex(ValueError, "below the checkpoints alone"):
            P.plan(m, **kw, gpu_peak_bytes=10**9)

    def test_host_ram_caps_the_pool(self):
        m = _model("qwen3-8b")   # 8 GPUs x 35 x 1 GiB = 280 GiB per node, 364 GiB with headroom
        self.assertEqual(P.plan(m, seq=131072).pool_bytes, 364 << 30)
        capped = P.plan(m, seq=131072, host_ram_bytes=300 << 30)
        self.assertEqual((capped.pool_bytes, capped.pool_bytes_with_headroom),
                         (300 << 30, 364 << 30))
        self.assertIn("pool_bytes: 322122547200 (capped at the node's host RAM",
                      P.format_settings(capped))
        short = P.plan(m, seq=131072, host_ram_bytes=256 << 30)
        self.assertEqual((short.pool_bytes, short.decision), (0, "host_ram_short"))
        settings = P.format_settings(short)
        self.assertNotIn("pool_bytes: 3", settings)
        self.assertIn("pool_bytes: none (no pool fits", settings)

    def test_tensor_parallel_splits_the_checkpoint(self):
        m = _model("qwen3-8b")
        one, eight = P.plan(m, seq=131072), P.plan(m, seq=131072, tp=8)
        self.assertEqual(eight.checkpoint_bytes_per_layer * 8, one.checkpoint_bytes_per_layer)
        self.assertEqual(eight.pinned_host_bytes_per_node * 8, one.pinned_host_bytes_per_node)
        self.assertAlmostEqual(eight.copy_seconds_per_layer * 8, one.copy_seconds_per_layer,
                               places=15)
        self.assertAlmostEqual(eight.forward_seconds_per_layer * 8,
                               one.forward_seconds_per_layer, places=14)
        self.assertAlmostEqual(eight.copy_to_forward_ratio, one.copy_to_forward_ratio, places=15)
        self.assertEqual(json.loads(P.format_plan_json(eight))["inputs"]["tensor_parallel_size"],
                         8)

    def test_bad_inputs(self):
        m = _model("qwen3-8b")
        for kwargs, needle in [
            (dict(seq=0), "sequence length"),
            (dict(seq=4096, batch=-1), "micro-batch"),
            (dict(seq=4096, gpus_per_node=4, gpus_per_link=8), "cannot exceed"),
            (dict(seq=4096, link="pcie9"), "unknown link"),
            (dict(seq=4096, link="-3"), "positive"),
            (dict(seq=4096, dtype="int8"), "dtype"),
            (dict(seq=4096, tflops=0), "compute rate"),
            (dict(seq=4.5), "sequence length"),
            (dict(seq=4096, keep_last_n=-1), "keep_last_n"),
            (dict(seq=4096, gpu_memory_bytes=-5), "gpu_memory_bytes"),
            (dict(seq=4096, tp=0), "tensor-parallel degree"),
            (dict(seq=1000, tp=3), "must be a multiple of tp \\(3\\)"),
            (dict(seq=4096, host_ram_bytes=-1), "host_ram_bytes"),
        ]:
            with self.subTest(kwargs=kwargs):
                with self.assertRaisesRegex(ValueError, needle):
                    P.plan(m, **kwargs)
        with self.assertRaisesRegex(ValueError, "layers"):
            P.plan(P.ModelShape(0, 4096, 4096, 1), seq=1)


class HfConfigTest(unittest.TestCase):
    def test_bad_configs(self):
        base = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                "intermediate_size": 128}
        self.assertEqual(P.model_from_hf_config_dict(base).params_per_layer,
                         4 * 64 * 64 + 3 * 64 * 128)
        for patch, needle in [
            ({"hidden_size": None}, "hidden_size"),
            ({"num_attention_heads": 5}, "divisible"),
            ({"num_hidden_layers": "2"}, "positive integer"),
            ({"num_hidden_layers": 2.5}, "positive integer"),
            ({"num_local_experts": 8}, "mixture-of-experts"),
        ]:
            with self.subTest(patch=patch):
                cfg = dict(base, **patch)
                cfg = {k: v for k, v in cfg.items() if v is not None}
                with self.assertRaisesRegex(ValueError, needle):
                    P.model_from_hf_config_dict(cfg)
        nested = P.model_from_hf_config_dict({"model_type": "x", "text_config": base})
        self.assertEqual(nested.layers, 2)
        self.assertEqual(nested.name, "x")

    def test_invalid_json_file(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write('{"num_hidden_layers": 2,')
        try:
            with self.assertRaisesRegex(ValueError, "invalid JSON"):
                P.model_from_hf_config(f.name)
        finally:
            os.unlink(f.name)


if __name__ == "__main__":
    unittest.main()
