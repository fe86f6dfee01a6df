"""The README's examples work as written: its Python snippets run top to bottom in a fresh
interpreter, every `topic-lm` command it (and results/README.md) shows parses and uses only models
the same page creates, and its relative links lead to files and headings that exist."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA
from topic_lm_hf.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = ("README.md", "results/README.md")


def _blocks(language: str, text: str = README) -> list[tuple[int, str]]:
    """(line number, code) of every fenced block of ``language``, in order."""
    return [(text[:m.start()].count("\n") + 2, m.group(1))
            for m in re.finditer(rf"^```{language}\n(.*?)^```", text, re.M | re.S)]


def _commands(text: str = README) -> list[list[str]]:
    commands = []
    for _, code in _blocks("bash", text):
        for line in code.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "topic-lm":
                if len(words) > 2 and f"{words[1]} {words[2]}" in COMMANDS:  # two-word commands: wsd train
                    words = [words[0], f"{words[1]} {words[2]}", *words[3:]]
                commands.append(words[1:])
    return commands


def test_readme_shows_python_snippets_and_commands():
    assert len(_blocks("python")) >= 3 and len(_commands()) >= 8


@pytest.mark.parametrize("page", PAGES)
def test_every_readme_command_parses_and_uses_a_model_the_readme_trains(page):
    from topic_lm_hf.cli import parse_command

    trained = set()
    for name, *argv in _commands((ROOT / page).read_text()):
        parsed = parse_command(name, argv)  # exits (an error) on an unknown flag or a missing argument
        flags = dict(zip(argv, argv[1:]))
        if name == "train":
            trained.add(parsed[2].output_dir)
        elif name == "wsd train":
            trained.add(parsed[1].output_dir)
            assert flags.get("--topic_model") in (None, *trained), flags["--topic_model"]
            if "--config_file" in flags:
                assert (ROOT / flags["--config_file"]).exists(), flags["--config_file"]
        elif "--model_name_or_path" in flags:
            assert flags["--model_name_or_path"] in trained, (
                f"`topic-lm {name}` uses {flags['--model_name_or_path']}, which no earlier README command trains")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_lead_to_files_and_headings_that_exist(page):
    path = ROOT / page
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)  # links in code are not links
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        assert file.exists(), f"{page}: {link}"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", file.read_text(), re.M)
            assert anchor in {_anchor(h) for h in headings}, f"{page}: {link}"


@pytest.mark.slow
@pytest.mark.skipif(not all((DATA / p).exists() for p in ("apnews/train.txt", "apnews/valid.txt",
                                                          "imdb/train.jsonl.gz", "wiki/articles.jsonl.gz", "r8/train.jsonl.gz",
                                                          "stopwords/mallet_en.txt")),
                    reason=f"the README's snippets read the real corpora in {DATA} (../shared/data), which are "
                           "absent; set TOPIC_LM_DATA to their folder")
def test_readme_python_snippets_run_top_to_bottom_in_a_fresh_interpreter(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(DATA.resolve(), target_is_directory=True)
    run = tmp_path / "run"  # the snippets' ../shared/data
    run.mkdir()
    script = "\n".join(f"print('=== README.md python block at line {line}', flush=True)\n{code}"
                       for line, code in _blocks("python"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_MODULES_CACHE": str(tmp_path / "modules")}
    proc = subprocess.run([sys.executable, "-c", script], cwd=run, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=1200)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    perplexities = [float(x) for x in re.findall(r"'perplexity': ([\d.]+)", proc.stdout)]
    assert perplexities and all(1 < p < 2000 for p in perplexities), proc.stdout[-3000:]
    for path in ("out/lstm-apnews/model.safetensors", "out/tcnlm-apnews/topic_tokenizer/tokenizer.json",
                 "out/hub/lstm-apnews/README.md", "out/hub/lstm-apnews/modeling_lstm_lm.py"):
        assert (run / path).exists(), path


@pytest.mark.parametrize("page", PAGES)
def test_the_readme_speaks_to_users_about_the_package(page):
    """No work-item or bookkeeping language: what was measured, on what hardware, is what a user needs."""
    text = (ROOT / page).read_text()
    for phrase in (r"\bthe issue\b", r"\bissue's\b", r"\bbars?\b(?! of)", r"\blent\b", r"\bwork items?\b",
                   r"single-thread job running"):
        found = [line for line in text.splitlines() if re.search(phrase, line, re.I)
                 and "progress bar" not in line and "error bars" not in line]
        assert not found, (phrase, found[:3])
