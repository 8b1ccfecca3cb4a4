"""The README as a new user meets it: its example runs as written, its numbers come from committed results
files, and its install lines pin what CI installs."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.utils import child_env

REPO_ROOT = Path(__file__).resolve().parents[1]
README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")


def _usage_example() -> str:
    match = re.search(r"^## Use\n\n```python\n(.*?)^```", README, re.S | re.M)
    assert match, "README has no python block right under '## Use'"
    return match.group(1)


def _gain_table_rows():
    head = README[: README.index("## Use")]
    return [line for line in head.splitlines() if line.startswith("| ") and "](benchmarks/results/" in line]


def test_usage_example_runs_as_written(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(_usage_example())
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=child_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "attention sites patched" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "torch.Size([2, 512]) torch.Size([1, 512])"


def test_gain_table_numbers_are_in_their_results_files():
    rows = _gain_table_rows()
    assert len(rows) >= 3, "the gains table (text batch, image batch, single request) is missing"
    for row in rows:
        link = re.search(r"\]\((benchmarks/results/[^)]+)\)", row).group(1)
        source = (REPO_ROOT / link).read_text(encoding="utf-8").replace(",", "")
        cells = row.replace(",", "").strip("|").split("|")
        unit = re.search(r"[\d.]+ (ms|img/s|captions/s)", cells[1]).group(1)
        stock, patched = (float(re.search(rf"([\d.]+) {unit}", cells[i]).group(1)) for i in (1, 2))
        recorded = {round(float(number), 2) for number in re.findall(r"\d+(?:\.\d+)?", source)}
        for value in (stock, patched):
            assert value in recorded, f"{value} {unit} is not a number of {link} (to 2 decimals)"
        gain = float(re.search(r"([\d.]+)x", cells[3]).group(1))
        measured = stock / patched if unit == "ms" else patched / stock  # times shrink, rates grow
        assert abs(measured - gain) < 0.02 * gain, row  # the cells are rounded
    assert "| end to end (files/strings to embeddings)" in README


def test_plot_shown_is_committed():
    image = re.search(r"!\[[^\]]*\]\((benchmarks/results/[^)]+\.png)\)", README)
    assert image and (REPO_ROOT / image.group(1)).is_file()


def test_cpu_torch_line_pins_what_ci_installs():
    pins = dict(re.findall(r"^(torch|torchvision)==(\S+)", (REPO_ROOT / "requirements-ci.txt").read_text(), re.M))
    line = next(line for line in README.splitlines() if "download.pytorch.org/whl/cpu" in line)
    assert f"torch=={pins['torch']}" in line and f"torchvision=={pins['torchvision']}" in line
    assert "--index-url" in line


def test_environment_table_is_the_one_in_envs():
    from clip_flash import envs

    assert envs.markdown_table() in README
    undocumented = set(re.findall(r"\bCLIP_FLASH_[A-Z_]+\b", README)) - set(envs.VARIABLES)
    assert not undocumented, f"README names variables clip_flash/envs.py does not declare: {sorted(undocumented)}"


def test_library_reads_only_declared_environment_variables():
    """Every ``CLIP_FLASH_*`` name in the package's code is declared in clip_flash/envs.py."""
    from clip_flash import envs

    named = set()
    for path in (REPO_ROOT / "clip_flash").rglob("*.py"):
        named |= set(re.findall(r"\bCLIP_FLASH_[A-Z_]+\b", path.read_text(encoding="utf-8")))
    assert named <= set(envs.VARIABLES), sorted(named - set(envs.VARIABLES))


def test_try_it_command_embeds_the_sample_photos(tmp_path):
    """The README's first command, after its install: ``clip-flash embed`` on the shipped examples/photos."""
    line = next(line.strip() for line in README.splitlines() if "&& clip-flash embed" in line)
    args = line.split("&& clip-flash embed", 1)[1].split()
    args[args.index("--out") + 1] = str(tmp_path / "out")
    done = subprocess.run([sys.executable, "-m", "clip_flash.cli", "embed", *args], capture_output=True, text=True,
                          timeout=600, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    photos = sorted(path.stem for path in (REPO_ROOT / "examples" / "photos").glob("*.jpg"))
    assert f"items: {len(photos)} ({len(photos)} embedded, 0 failed" in done.stdout
    assert "RANDOM-INIT" in done.stderr  # the default model says its embeddings are meaningless for search
    import numpy as np
    import pyarrow.parquet as pq

    embeddings = np.load(tmp_path / "out" / "img_emb" / "img_emb_0.npy")
    metadata = pq.read_table(tmp_path / "out" / "metadata" / "metadata_0.parquet").to_pydict()
    assert embeddings.shape == (len(photos), 512)
    assert sorted(Path(path).stem for path in metadata["image_path"]) == photos
    assert sum(1 for caption in metadata["caption"] if caption) == 3  # three photos have a caption beside them


def _serve_options_table() -> str:
    return README[README.index("### Options"):README.index("### Metrics")]


def test_serve_options_table_lists_every_option_with_its_default():
    """Every option of ``clip-flash serve`` has a row in the README's table, and a row whose default is a plain
    number says the parser's."""
    import argparse

    from clip_flash.serve.cli import add_arguments

    parser = add_arguments(argparse.ArgumentParser())
    table = _serve_options_table()
    rows = {}
    for line in table.splitlines():
        cells = line.strip("|").split("|") if line.startswith("| `--") else []
        for option in re.findall(r"`(--[a-z0-9-]+)", cells[0] if cells else ""):
            rows[option] = cells[1].strip()
    for action in parser._actions:
        for option in action.option_strings:
            if option in ("-h", "--help"):
                continue
            assert option in rows or option in table, f"README's serve options table lacks {option}"
            default = rows.get(option, "")
            if re.fullmatch(r"\d+", default):
                assert int(default) == action.default, f"{option}: README says {default}, the parser {action.default}"
