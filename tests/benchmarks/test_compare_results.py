"""benchmarks/compare_results.py: per-shape ratios of two bench_clip JSON runs, regressions flagged; rate ratios of
pipeline runs, job benches, preprocessing throughput runs and server curves (benchmarks/harness/compare.py). CPU
only."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness.compare import pair_keys

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks" / "compare_results.py"
_spec = importlib.util.spec_from_file_location("compare_results", SCRIPT)
compare_results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_results)


def write_run(path: Path, rows, *, precision="fp16", revision="abc1234") -> Path:
    """A bench_clip JSON file with the fields compare_results reads (as scripts/bench_clip.py writes them)."""
    data = {
        "schema": "clip_flash.bench_clip/1",
        "environment": {"git_revision": revision, "device_name": "Fake GPU", "command": "bench_clip.py ..."},
        "models": [{"name": "ViT-L-14", "precision": precision, "rows": [
            {"model": "ViT-L-14", "tower": tower, "batch": batch, "stock_median_ms": stock,
             "patched_median_ms": patched}
            for tower, batch, stock, patched in rows]}],
        "complete": True,
    }
    path.write_text(json.dumps(data))
    return path


def test_flags_a_patched_regression_past_the_threshold(tmp_path, capsys):
    old = write_run(tmp_path / "old.json", [("image", 1, 6.0, 4.0), ("image", 256, 120.0, 96.0)])
    new = write_run(tmp_path / "new.json", [("image", 1, 6.0, 4.4), ("image", 256, 118.0, 96.5)])
    assert compare_results.main([str(old), str(new)]) == 1
    out = capsys.readouterr().out
    line_b1 = next(line for line in out.splitlines() if "| image | 1 |" in line)
    assert "4.000 -> 4.400 | 1.100" in line_b1 and "REGRESSION" in line_b1
    line_b256 = next(line for line in out.splitlines() if "| image | 256 |" in line)
    assert "120.000 -> 118.000 | 0.983" in line_b256 and "REGRESSION" not in line_b256
    assert "1 shape(s) regressed past 5%: ViT-L-14 image b1 fp16" in out
    # A looser threshold lets the same runs pass.
    assert compare_results.main([str(old), str(new), "--threshold", "0.15"]) == 0


def test_no_regression_exits_zero_and_lists_unmatched_shapes(tmp_path, capsys):
    old = write_run(tmp_path / "old.json", [("image", 1, 6.0, 4.0), ("image", 64, 30.0, 24.0)])
    new = write_run(tmp_path / "new.json", [("image", 1, 6.2, 3.9), ("image", 16, 7.7, 6.5)])
    assert compare_results.main([str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "only in the old run: ViT-L-14 image batch 64 fp16" in out
    assert "only in the new run: ViT-L-14 image batch 16 fp16" in out


def test_shapes_differ_by_dtype(tmp_path):
    old = write_run(tmp_path / "old.json", [("image", 1, 6.0, 4.0)], precision="fp16")
    new = write_run(tmp_path / "new.json", [("image", 1, 6.0, 9.0)], precision="bf16")
    assert compare_results.compare(compare_results.read_rows(old)[0], compare_results.read_rows(new)[0],
                                   0.05)[1] == []  # different dtypes: not the same shape


def test_bad_files_exit_two(tmp_path, capsys):
    good = write_run(tmp_path / "good.json", [("image", 1, 6.0, 4.0)])
    (tmp_path / "other.json").write_text(json.dumps({"schema": "something else"}))
    (tmp_path / "broken.json").write_text("{")
    assert compare_results.main([str(good), str(tmp_path / "other.json")]) == 2
    assert compare_results.main([str(tmp_path / "broken.json"), str(good)]) == 2
    assert compare_results.main([str(good), str(tmp_path / "missing.json")]) == 2
    assert "not a bench_clip result" in capsys.readouterr().err


def test_runs_as_a_script_on_the_committed_run():
    """The committed ViT-L-14 image run against itself: every ratio 1, exit 0."""
    committed = REPO_ROOT / "benchmarks" / "results" / "h100" / "ViT-L-14-image.json"
    if not committed.is_file():
        pytest.skip("no committed ViT-L-14 image run")
    done = subprocess.run([sys.executable, str(SCRIPT), str(committed), str(committed)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "| ViT-L-14 | image | 256 | fp16 |" in done.stdout and "REGRESSION" not in done.stdout


# ----- pipelines, job benches, preprocessing throughput (benchmarks/harness/compare.py) -----------------------
ENVIRONMENT = {"command": "python scripts/x.py ...", "git_revision": "abc1234", "device": "cuda",
               "device_name": "Fake GPU", "python": "3.12.3",
               "clip_flash_environment": {"torch": "2.11.0+cu130", "gpu": "Fake GPU"}}


def write_pipelines(path: Path, pipelines, *, encoder=41000.0, revision="abc1234", model="ViT-B-32") -> Path:
    """A bench_clip --pipeline JSON: no tower rows, each model's image_pipelines (as bench_clip.py writes it)."""
    data = {
        "schema": "clip_flash.bench_clip/1",
        "environment": {**ENVIRONMENT, "git_revision": revision,
                        "command": "python3 scripts/bench_clip.py --model ViT-B-32 --pipeline exact gpu stock"},
        "settings": {"pipeline": [name for name, *_ in pipelines], "pipeline_batch": 256},
        "models": [{"spec": model, "name": model, "precision": "fp16", "rows": [], "image_pipelines": {
            "files": 384, "cpu_cores": 16,
            "pipelines": [{"pipeline": name, "cpu_workers": 16, "executor": executor, "batch": 256,
                           "timed_batches": 24, "images_embedded": 6144, "seconds": 6144 / rate,
                           "images_per_s": rate, "routes": {"jpeg": 6144}, "skipped_files": []}
                          for name, executor, rate in pipelines],
            "encoder_only": {"batch": 256, "ms": 256e3 / encoder, "images_per_s": encoder}}}],
        "complete": True,
    }
    path.write_text(json.dumps(data))
    return path


def write_job(path: Path, cases, *, repeat=60, revision="abc1234", ceiling=42000.0) -> Path:
    """A bench_embed embed_bench.json: rates as the script formats them ("2,223", "n/a")."""
    rows = [{"model": "ViT-B-32", "inputs": f"384 photos x {repeat}", "pipeline": label, "items": 384 * repeat,
             "failures": 0, "items/s (steady)": steady, "items/s (whole run)": whole, "items/s (with setup)": "n/a",
             "x stock": "1.00", "summary": {"items": 384 * repeat}}
            for label, steady, whole in cases]
    data = {**ENVIRONMENT, "git_revision": revision, "command": f"python benchmarks/bench_embed.py --repeat {repeat}",
            "cpu_cores": 16, "encoder_only_items_per_s": {"ViT-B-32": {"image": ceiling, "text": 230000.0}},
            "rows": rows}
    path.write_text(json.dumps(data))
    return path


def write_throughput(path: Path, rows, *, revision="abc1234") -> Path:
    """An image_decode_throughput --json file (results.write_microbenchmark's record)."""
    data = {**ENVIRONMENT, "git_revision": revision, "title": "ImagePreprocessor alone ...", "rows": rows}
    path.write_text(json.dumps(data))
    return path


def table_line(out: str, *cells: str) -> str:
    """The one table line holding ``| cell | cell |`` in that order."""
    wanted = "| " + " | ".join(cells) + " |"
    found = [line for line in out.splitlines() if wanted in line]
    assert len(found) == 1, (wanted, out)
    return found[0]


def test_pipelines_compare_images_per_s(tmp_path, capsys):
    old = write_pipelines(tmp_path / "old.json", [("exact", "process", 6000.0), ("gpu", "thread", 4000.0),
                                                  ("stock", "processes (DataLoader)", 2500.0)], revision="1111111")
    new = write_pipelines(tmp_path / "new.json", [("exact", "process", 5400.0), ("gpu", "process", 12000.0),
                                                  ("gpu-nvjpeg-chroma", "process", 13000.0)], encoder=40000.0,
                          revision="2222222")
    assert compare_results.main([str(old), str(new)]) == 0  # rates are marked, never judged
    out = capsys.readouterr().out
    assert "old: " in out and "(bench_clip pipelines): git 1111111, Fake GPU, torch 2.11.0+cu130" in out
    assert "git 2222222" in out and "command: python3 scripts/bench_clip.py" in out
    assert "| model | dtype | pipeline | workers, batch | images/s old -> new | ratio | |" in out
    line = table_line(out, "ViT-B-32", "fp16", "gpu", "thread x16, b256 -> process x16, b256")
    assert "| 4,000 -> 12,000 | 3.000 |  |" in line
    line = table_line(out, "ViT-B-32", "fp16", "exact", "process x16, b256")
    assert "| 6,000 -> 5,400 | 0.900 | slower (images/s < 0.952) |" in line
    assert "| 41,000 -> 40,000 | 0.976 |" in table_line(out, "ViT-B-32", "fp16", "(encoder alone)", "b256")
    assert "only in the old run: ViT-B-32 / fp16 / stock" in out
    assert "only in the new run: ViT-B-32 / fp16 / gpu-nvjpeg-chroma" in out
    assert "regression" not in out  # the tower-shape verdict is not printed for pipeline runs


def test_pipeline_rows_are_read_per_model_and_dtype(tmp_path):
    run = compare_results.open_results(write_pipelines(tmp_path / "run.json", [("exact", "process", 6000.0)]))
    assert run.kinds == ("pipelines",)
    rows = run.rows("pipelines")
    assert rows.values == {("ViT-B-32", "fp16", "exact"): {"images/s": 6000.0},
                           ("ViT-B-32", "fp16", "(encoder alone)"): {"images/s": 41000.0}}


def test_job_benches_compare_steady_and_whole_run(tmp_path, capsys):
    old = write_job(tmp_path / "old.json", [("stock OpenCLIP (DataLoader)", "2,223", "1,607"),
                                            ("clip_flash, exact, decode in processes", "5,477", "1,272"),
                                            ("clip_flash, decode gpu", "4,283", "3,416")], repeat=60)
    new = write_job(tmp_path / "new.json", [("stock OpenCLIP (DataLoader)", "1,841", "1,577"),
                                            ("clip_flash, exact, decode in processes", "2,983", "2,575"),
                                            ("clip_flash, decode gpu, read in processes", "14,213", "10,810")],
                    repeat=150, ceiling=42000.0)
    assert compare_results.main([str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "(bench_embed job bench): git abc1234, Fake GPU, torch 2.11.0+cu130, command: python benchmarks/" in out
    line = table_line(out, "ViT-B-32", "photos", "clip_flash, exact, decode in processes", "23,040 -> 57,600")
    assert "| 5,477 -> 2,983 | 0.545 | 1,272 -> 2,575 | 2.024 | slower (steady < 0.952) |" in line
    line = table_line(out, "ViT-B-32", "photos", "stock OpenCLIP (DataLoader)")
    assert "| 2,223 -> 1,841 | 0.828 | 1,607 -> 1,577 | 0.981 |" in line
    line = table_line(out, "ViT-B-32", "on the GPU", "(encoder only, image)", "-")
    assert "| 42,000 -> 42,000 | 1.000 | - | - |  |" in line
    # Cases are keyed by their label: a renamed case is listed, not compared.
    assert "only in the old run: ViT-B-32 / photos / clip_flash, decode gpu" in out
    assert "only in the new run: ViT-B-32 / photos / clip_flash, decode gpu, read in processes" in out


def test_a_job_case_run_several_times_compares_by_its_median(tmp_path, capsys):
    graphs, eager = "clip_flash, exact, decode in processes", "clip_flash, exact, decode in processes, no CUDA graphs"
    old = write_job(tmp_path / "old.json", [(graphs, "4,980", "3,929")], repeat=150)
    new = write_job(tmp_path / "new.json", [(eager, "5,592", "4,646"), (graphs, "6,002", "4,764"),
                                            (eager, "5,395", "4,877"), (graphs, "5,720", "5,115"),
                                            (graphs, "5,900", "n/a")], repeat=150)
    assert compare_results.main([str(old), str(new)]) == 0
    out = capsys.readouterr().out
    line = table_line(out, "ViT-B-32", "photos", graphs, "57,600 -> 57,600 (median of 3 runs)")
    assert "| 4,980 -> 5,900 | 1.185 | 3,929 -> 4,940 | 1.257 |" in line  # whole run: the median of the two known
    assert f"only in the new run: ViT-B-32 / photos / {eager}" in out


def test_job_rates_parse_formatted_numbers_and_input_kinds(tmp_path):
    path = write_job(tmp_path / "run.json", [("stock OpenCLIP", "14,335", "n/a")])
    data = json.loads(path.read_text())
    data["rows"][0]["inputs"] = "50000 ImageNet captions"
    path.write_text(json.dumps(data))
    rows = compare_results.open_results(path).rows("job")
    assert rows.values[("ViT-B-32", "ImageNet captions", "stock OpenCLIP")] == {"steady": 14335.0,
                                                                               "whole run": None}


def test_throughput_pairs_unrecorded_routes_and_takes_the_median_of_rounds(tmp_path, capsys):
    baseline = {"executor": "decode_jpeg threads (baseline)", "workers": 16, "prepared_images_per_s": None}
    # Before --jpeg-route: one row per configuration, no round, no route.
    old = write_throughput(tmp_path / "old.json", [
        {**baseline, "decode_images_per_s": 1500.0},
        {"executor": "process", "workers": 16, "decode_images_per_s": 4000.0, "prepared_images_per_s": 4800.0},
        {"executor": "thread", "workers": 8, "decode_images_per_s": 1600.0, "prepared_images_per_s": 1700.0}])
    # Now: rounds, each configuration with and without the GPU JPEG route.
    gpu, cpu = "GPU (entropy decode on CPU)", "CPU (whole decode)"
    new = write_throughput(tmp_path / "new.json", [{**baseline, "decode_images_per_s": 1200.0}] + [
        {"executor": "process", "workers": 16, "round": number, "jpeg_route": route,
         "decode_images_per_s": decode, "prepared_images_per_s": prepared}
        for number, route, decode, prepared in ((1, gpu, 9000.0, 9600.0), (1, cpu, 4000.0, 4700.0),
                                                (2, gpu, 8000.0, 9800.0), (2, cpu, 4100.0, 4900.0),
                                                (3, gpu, 8500.0, 9000.0), (3, cpu, 3900.0, 4800.0))])
    assert compare_results.main([str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "| executor | workers | JPEG route | rounds | decode images/s old -> new | ratio |" in out
    line = table_line(out, "decode_jpeg threads (baseline)", "16", "-", "1")
    assert "| 1,500 -> 1,200 | 0.800 | - | - | slower (decode < 0.952) |" in line
    line = table_line(out, "process", "16", f"- -> {gpu}", "1 -> 3")
    assert "| 4,000 -> 8,500 | 2.125 | 4,800 -> 9,600 | 2.000 |  |" in line  # medians of the 3 rounds
    line = table_line(out, "process", "16", f"- -> {cpu}", "1 -> 3")
    assert "| 4,000 -> 4,000 | 1.000 | 4,800 -> 4,800 | 1.000 |  |" in line
    assert "only in the old run: thread / 8 / -" in out


def test_pair_keys_matches_an_unrecorded_last_part_only_when_asked():
    old, new = [("process", "16", "-")], [("process", "16", "GPU"), ("thread", "16", "GPU")]
    assert pair_keys(old, new) == ([], old, new)
    assert pair_keys(old, new, unrecorded_last_matches=True) == (
        [(("process", "16", "-"), ("process", "16", "GPU"))], [], [("thread", "16", "GPU")])


def test_different_kinds_say_so_and_exit_zero(tmp_path, capsys):
    pipelines = write_pipelines(tmp_path / "pipelines.json", [("exact", "process", 6000.0)])
    job = write_job(tmp_path / "job.json", [("stock OpenCLIP (DataLoader)", "2,223", "1,607")])
    shapes = write_run(tmp_path / "shapes.json", [("image", 1, 6.0, 4.0)])
    assert compare_results.main([str(pipelines), str(job)]) == 0
    captured = capsys.readouterr()
    assert ("different kinds of result: the old run is bench_clip pipelines, the new one bench_embed job bench: "
            "nothing to compare") in captured.err
    assert "git abc1234" in captured.out  # both headers still say what was compared
    assert compare_results.main([str(shapes), str(pipelines)]) == 0
    assert "the old run is bench_clip tower shapes, the new one bench_clip pipelines" in capsys.readouterr().err


def test_no_common_rows_say_so_and_exit_zero(tmp_path, capsys):
    old = write_pipelines(tmp_path / "old.json", [("exact", "process", 6000.0)], model="ViT-B-32")
    new = write_pipelines(tmp_path / "new.json", [("exact", "process", 2600.0)], model="ViT-L-14")
    assert compare_results.main([str(old), str(new)]) == 0
    captured = capsys.readouterr()
    assert "no bench_clip pipelines row is in both runs: nothing to compare" in captured.err
    assert "only in the new run: ViT-L-14 / fp16 / exact" in captured.out


def test_a_run_with_tower_rows_and_pipelines_compares_both(tmp_path, capsys):
    def both(path, patched, rate):
        write_run(path, [("image", 1, 6.0, patched)])
        data = json.loads(path.read_text())
        pipelines = json.loads(write_pipelines(tmp_path / "p.json", [("exact", "process", rate)]).read_text())
        data["models"][0]["image_pipelines"] = pipelines["models"][0]["image_pipelines"]
        path.write_text(json.dumps(data))
        return path

    old, new = both(tmp_path / "old.json", 4.0, 6000.0), both(tmp_path / "new.json", 4.4, 6600.0)
    assert compare_results.main([str(old), str(new)]) == 1  # the tower verdict stands
    out = capsys.readouterr().out
    assert "1 shape(s) regressed past 5%" in out
    assert "| 6,000 -> 6,600 | 1.100 |" in table_line(out, "ViT-L-14", "fp16", "exact")


def test_other_records_are_not_results_it_reads(tmp_path, capsys):
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text(json.dumps({**ENVIRONMENT, "title": "tokenizer", "rows": [{"caption_set": "x"}]}))
    good = write_job(tmp_path / "job.json", [("stock OpenCLIP (DataLoader)", "2,223", "1,607")])
    assert compare_results.main([str(tokenizer), str(good)]) == 2
    assert "nor a bench_embed, image_decode_throughput, bench_serve, image_latency, bench_text_batches or " \
        "bench_packed_attention JSON" in capsys.readouterr().err


def test_serve_curves_compare_achieved_rates_per_offered_rate(tmp_path, capsys):
    def curve(path, revision, points):
        path.write_text(json.dumps({
            "runs": [{"git_revision": revision, "device_name": "Fake GPU", "command": "bench_serve.py ..."}],
            "configs": {"clip_flash": {"curves": {"image-raw": {"points": [
                {"offered_rps": offered, "achieved_rps": achieved, "latency_ms": {"p50": p50, "p99": p99}}
                for offered, achieved, p50, p99 in points]}}}}}))
        return path

    old = curve(tmp_path / "old.json", "aaa", [(800.0, 800.0, 9.0, 20.0), (1600.0, 1500.0, 90.0, 150.0)])
    new = curve(tmp_path / "new.json", "bbb", [(800.0, 799.0, 8.0, 18.0), (1600.0, 1200.0, 95.0, 190.0),
                                              (3200.0, 1300.0, 400.0, 600.0)])
    assert compare_results.main([str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "git aaa, Fake GPU" in out and "git bbb, Fake GPU" in out
    assert "| clip_flash | image-raw | 800.0 | 9.0 / 20.0 -> 8.0 / 18.0 | 800 -> 799 | 0.999 |  |" in out
    assert "| 1,600.0 | 90.0 / 150.0 -> 95.0 / 190.0 | 1,500 -> 1,200 | 0.800 | slower (achieved < 0.952) |" in out
    assert "only in the new run: clip_flash / image-raw / 3,200.0" in out


def test_image_latency_runs_compare_p50_and_p99_old_over_new(tmp_path, capsys):
    def latency(path, revision, clip_flash_p50, step_p50):
        path.write_text(json.dumps({"git_revision": revision, "device_name": "Fake GPU", "command": "image_latency.py",
                                    "rows": [{"side": "stock", "requests": 1000, "p50_ms": 14.0, "p99_ms": 24.0},
                                             {"side": "clip_flash", "requests": 1000, "p50_ms": clip_flash_p50,
                                              "p99_ms": 4.0},
                                             {"step": "GraphedEncoder  encode_image", "p50_ms": step_p50},
                                             {"embedding_cosine_stock_vs_clip_flash": 0.999999}]}))
        return path

    old = latency(tmp_path / "old.json", "aaa", 3.4, 1.6)
    new = latency(tmp_path / "new.json", "bbb", 3.0, 1.8)
    assert compare_results.main([str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "times (ms) old -> new, ratio old / new (above 1 is faster)" in out
    assert "| clip_flash | 1000 | 3.400 -> 3.000 | 1.133 | 4.000 -> 4.000 | 1.000 |  |" in out
    assert "| step: GraphedEncoder encode_image | - | 1.600 -> 1.800 | 0.889 | - | - | slower (p50 < 0.952) |" in out


def test_text_batches_compare_captions_per_s_and_pair_runs_without_groupings(tmp_path, capsys):
    def run(path, revision, rows):
        path.write_text(json.dumps({"git_revision": revision, "device_name": "Fake GPU", "command": "bench_tb",
                                    "rows": rows}))
        return path

    old = run(tmp_path / "old.json", "aaa", [
        {"batch": 1024, "per_doubling": 4, "token_rows_per_caption": 36.7, "captions_per_s": 53000.0},
        {"alone_batch": 1024, "alone_captions_per_s": 75000.0}])
    new = run(tmp_path / "new.json", "bbb", [
        {"batch": 1024, "per_doubling": 4, "grouping": "cost-packed", "token_rows_per_caption": 24.9,
         "captions_per_s": 78000.0},
        {"alone_batch": 1024, "alone_captions_per_s": 90000.0}, {"profiled": []}])
    assert compare_results.main([str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "| 1024 | 4 | - -> cost-packed | 36.7 -> 24.9 | 53,000 -> 78,000 | 1.472 |  |" in out
    assert "| 1024 | - | encoder alone (eager) | - | 75,000 -> 90,000 | 1.200 |  |" in out


def test_packed_attention_runs_compare_microseconds_old_over_new(tmp_path, capsys):
    def run(path, revision, kernel_name, kernel_us):
        path.write_text(json.dumps({"git_revision": revision, "device_name": "Fake GPU", "command": "bench_pa",
                                    "rows": [{"captions": 1024, "tokens": 25767, "max_seqlen": 77,
                                              "us": {"varlen_attn": 286.0, kernel_name: kernel_us}}]}))
        return path

    old = run(tmp_path / "old.json", "aaa", "packed_attention", 108.0)
    new = run(tmp_path / "new.json", "bbb", "packed_attention (4 warps)", 120.0)
    assert compare_results.main([str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "times (us) old -> new, ratio old / new (above 1 is faster)" in out
    assert "| 1024 | 77 | 25,767 | 286.000 -> 286.000 | 1.000 | 108.000 -> 120.000 | 0.900 | slower" in out


JOB_RUN = "job_final_cc384da/embed_bench_cc384da.json"  # the one committed H100 job run: compared with itself


@pytest.mark.parametrize("old, new, expected", [
    ("ViT-B-32-pipelines_001db2f.json", "ViT-B-32-pipelines_946ba19.json", "| ViT-B-32 | fp16 | exact |"),
    (JOB_RUN, JOB_RUN, "| ViT-B-32 | photos | stock OpenCLIP (DataLoader) |"),
    (JOB_RUN, JOB_RUN, "| ViT-B-32 | photos | clip_flash, exact, decode in processes |"),
    ("image_decode_throughput_f5006ac.json", "image_decode_throughput_f5006ac.json",
     "| process | 16 | GPU (entropy decode on CPU) | 2 |"),
    ("serve_ab_80bab2b/old_a/serve_bench.json", "serve_ab_80bab2b/new_a/serve_bench.json",
     "| clip_flash | image-raw | 1,600.0 | 32.703 / 62.783 -> 16.215 / 35.327 | 1,599 -> 1,601 | 1.001 |  |"),
    ("job_0bcb378/image_latency_ViT-L-14.json", "serve_latency_8da9c3e/image_latency_ViT-L-14.json",
     "| clip_flash | 1000 | 3.430 -> 3.071 | 1.117 | 4.304 -> 3.790 | 1.136 |  |"),
    ("packed_attention_a17619e/text_batches_7f9c643.json", "packed_attention_a17619e/text_batches_a17619e.json",
     "| 1024 | 4 | cost-packed | 24.9 | 66,852 -> 78,403 | 1.173 |  |"),
    ("packed_attention_a17619e/packed_attention_a17619e.json", "packed_attention_a17619e/packed_attention_a17619e.json",
     "| 1024 | 77 | 25,767 | 286.040 -> 286.040 | 1.000 | 108.221 -> 108.221 | 1.000 |  |"),
])
def test_runs_as_a_script_on_committed_rate_runs(old, new, expected):
    committed = REPO_ROOT / "benchmarks" / "results" / "h100"
    old_path, new_path = committed / old, committed / new
    if not (old_path.is_file() and new_path.is_file()):
        pytest.skip("committed runs not present")
    done = subprocess.run([sys.executable, str(SCRIPT), str(old_path), str(new_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout and "nothing to compare" not in done.stderr
    assert done.stdout.count("NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, command: python") == 2
