"""The README's examples work as written: its Python snippets run top to bottom in a fresh
interpreter, its `topic-lm` command lines run in order in a fresh clone, every `topic-lm` command it (and
results/README.md) shows parses and uses only models the same page creates, and its relative links (and those of
results/README.md and scripts/README.md) lead to files and headings that exist. The README stays short (its
measurements live in results/README.md), and scripts/README.md names every runnable script."""

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
PAGES = ("README.md", "results/README.md", "scripts/README.md")
MAX_README_LINES = 600


def _blocks(language: str, text: str = README) -> list[tuple[int, str]]:
    """(line number, code) of every fenced block of ``language``, in order."""
    return [(text[:m.start()].count("\n") + 2, m.group(1))
            for m in re.finditer(rf"^```{language}\n(.*?)^```", text, re.M | re.S)]


def _commands(text: str = README) -> list[list[str]]:
    """Every `topic-lm` command of the bash blocks as [command, *arguments] (two-word commands: 'wsd train')."""
    commands = []
    for line in _command_lines(text):
        words = shlex.split(line)
        if len(words) > 2 and f"{words[1]} {words[2]}" in COMMANDS:
            words = [words[0], f"{words[1]} {words[2]}", *words[3:]]
        commands.append(words[1:])
    return commands


def _command_lines(text: str = README) -> list[str]:
    """Every `topic-lm` line of the bash blocks, continuation lines joined, comments left out."""
    lines = []
    for _, code in _blocks("bash", text):
        for line in code.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "topic-lm":
                lines.append(shlex.join(words))
    return lines


def test_readme_shows_python_snippets_and_commands():
    assert len(_blocks("python")) >= 3 and len(_commands()) >= 8


def test_readme_is_at_most_600_lines():
    """The README says what the package is and how to use it; tables of measurements go to results/README.md."""
    lines = len(README.splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES}): move measurements " \
                                      "to results/README.md and link them"


def test_scripts_readme_names_every_runnable_script():
    """Every script of scripts/ that runs as a program (``if __name__ == "__main__"``) has its line in
    scripts/README.md, named as `<name>.py`."""
    listed = (ROOT / "scripts" / "README.md").read_text()
    runnable = sorted(p.name for p in (ROOT / "scripts").glob("*.py")
                      if re.search(r"^if __name__ == ['\"]__main__['\"]", p.read_text(), re.M))
    assert len(runnable) >= 10, runnable  # the benchmarks and tools: the pattern still finds them
    missing = [name for name in runnable if f"`{name}`" not in listed]
    assert not missing, f"scripts/README.md does not name {missing}"


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


# The full corpora the README's downstream examples read from $TOPIC_LM_DATA (README: Corpora)
FULL_CORPORA = ("20ng/train.jsonl.gz", "r8/train.jsonl.gz", "wsd/semcor", "wsd/semeval2007", "wsd/senseval2",
                "wordnet/senses.tsv.gz")


def _corpora_environment(env: dict) -> tuple[dict, bool]:
    """``env`` with TOPIC_LM_DATA pointing at the full corpora when they are here (else without it), and whether they
    are: without them the examples that read them (``data_dir(`` in Python, ``$TOPIC_LM_DATA`` on the command line)
    are left out, and everything else runs as a fresh clone runs it."""
    env = dict(env)
    env.pop("TOPIC_LM_DATA", None)
    present = all((DATA / p).exists() for p in FULL_CORPORA)
    if present:
        env["TOPIC_LM_DATA"] = str(DATA.resolve())
    return env, present


@pytest.mark.slow
def test_readme_python_snippets_run_top_to_bottom_in_a_fresh_interpreter(tmp_path):
    run = tmp_path / "run"  # nothing beside it: the snippets read the package's own corpus, the rest $TOPIC_LM_DATA
    run.mkdir()
    env, full = _corpora_environment(os.environ)
    blocks = [(line, code) for line, code in _blocks("python") if full or "data_dir(" not in code]
    assert len(blocks) >= len(_blocks("python")) - 2  # only the downstream examples need the full corpora
    script = "\n".join(f"print('=== README.md python block at line {line}', flush=True)\n{code}"
                       for line, code in blocks)
    env = {**env, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_MODULES_CACHE": str(tmp_path / "modules")}
    proc = subprocess.run([sys.executable, "-c", script], cwd=run, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=1200)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    perplexities = [float(x) for x in re.findall(r"'perplexity': ([\d.]+)", proc.stdout)]
    assert perplexities and all(1 < p < 2000 for p in perplexities), proc.stdout[-3000:]
    for path in ("out/lstm-wiki/model.safetensors", "out/tcnlm-wiki/topic_tokenizer/tokenizer.json",
                 "out/hub/lstm-wiki/README.md", "out/hub/lstm-wiki/modeling_lstm_lm.py"):
        assert (run / path).exists(), path


# Flags appended to a README command line (argparse keeps the last value of a flag): the same commands on a
# smaller budget. Everything else runs as written.
BUDGET = {"train": ["--max_steps", "3", "--logging_steps", "1"],
          "train topics": ["--pretrain_topic_model_steps", "20"],  # the steering recipe's pre-training, capped
          "evaluate": ["--max_eval_documents", "20"],
          "classify": ["--max_train_documents", "120", "--max_test_documents", "60", "--epochs", "1"],
          "retrieve": ["--max_train_documents", "200", "--max_test_documents", "40"],
          "wsd train": ["--max_train_documents", "2"]}


@pytest.mark.slow
def test_readme_command_lines_run_in_order_in_a_fresh_clone(tmp_path):
    import shutil

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("a fresh clone needs git and the repository's history")
    clone = tmp_path / "topic-lm-hf"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    env, full = _corpora_environment(os.environ)
    # as `source .venv/bin/activate` has it: topic-lm on the PATH, running the clone's code
    env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(clone / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_MODULES_CACHE": str(tmp_path / "modules")}
    lines = _command_lines()
    assert [line.split()[1] for line in lines] == ["train", "evaluate", "generate", "train", "evaluate", "topics",
                                                   "generate", "classify", "retrieve", "wsd", "wsd", "export"]
    lines = [line for line in lines if full or "$TOPIC_LM_DATA" not in line]
    assert len(lines) >= 8  # without the full corpora, all but the downstream tasks
    for line in lines:
        words = [w.replace("$TOPIC_LM_DATA", env["TOPIC_LM_DATA"]) if full else w for w in shlex.split(line)]
        line = shlex.join(words)
        name = " ".join(words[1:3]) if words[1] == "wsd" else words[1]
        budget = BUDGET.get(name, []) + (BUDGET["train topics"] if name == "train" and "lstm_lm" not in words else [])
        command = line + "".join(f" {shlex.quote(w)}" for w in budget)
        proc = subprocess.run(command, shell=True, cwd=clone, env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=900)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        if name == "evaluate":
            assert "| causal |" in proc.stdout or "causal" in proc.stdout, proc.stdout[-2000:]
        elif name == "topics":
            assert len(re.findall(r"^topic\s*\d+", proc.stdout, re.M | re.I)) >= 10, proc.stdout[-2000:]
        elif name in ("classify", "retrieve", "wsd evaluate"):
            assert "|" in proc.stdout, proc.stdout[-2000:]  # the result table
    for path in ("out/lstm-cli/model.safetensors", "out/tcnlm-cli/perplexity.json", "out/hub/lstm-cli/README.md",
                 *(["out/wsd-tcnlm/config.json"] if full else [])):
        assert (clone / path).exists(), path


@pytest.mark.parametrize("page", PAGES)
def test_the_readme_speaks_to_users_about_the_package(page):
    """No work-item or bookkeeping language: what was measured, on what hardware, is what a user needs."""
    text = (ROOT / page).read_text()
    for phrase in (r"\bthe issue\b", r"\bissue's\b", r"\bbars?\b(?! of)", r"\blent\b", r"\bwork items?\b",
                   r"single-thread job running"):
        found = [line for line in text.splitlines() if re.search(phrase, line, re.I)
                 and "progress bar" not in line and "error bars" not in line]
        assert not found, (phrase, found[:3])
