"""The commands in README.md and docs/ stay true to the code: every `samtone MODE` (or `$S MODE`)
line names a mode that exists and only flags that mode accepts, and every `--gin.NAME.PARAM=` and
`NAME.PARAM = ` they write is a parameter of a registered gin configurable. (tests/test_own_data.py
runs the GUIDE's step-by-step fine-tune itself, at tiny size; tests/test_finetune.py the README's command.)"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import gin
import pytest

from samtone_jax.cli import gin_registry  # noqa: F401  (registers every gin name)
from samtone_jax.cli import main as cli

REPO = Path(__file__).resolve().parent.parent
DOCS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "samtone_jax" / "gin_configs").rglob("*.gin")),
]
COMMAND = re.compile(r"(?:\$S|(?<![\w/-])samtone|run\.sh(?: --\S+)*)\s+([a-z][a-z-]+)\b(.*)")


def _logical_lines(path: Path):
    """(line number, text) with backslash continuations joined (a gin comment's '# ' dropped)."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        start, text = i, lines[i]
        while text.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text.rstrip()[:-1] + " " + lines[i].lstrip("# ")
        yield start + 1, text
        i += 1


def _modes() -> dict[str, set[str]]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, cli.argparse._SubParsersAction))
    return {mode: {s for a in p._actions for s in a.option_strings} for mode, p in sub.choices.items()}


def _commands():
    modes = _modes()
    for path in DOCS:
        for number, text in _logical_lines(path):
            for match in COMMAND.finditer(text):
                if match.group(1) in modes:
                    yield f"{path.relative_to(REPO)}:{number}", match.group(1), match.group(2).split("`")[0]


def test_every_documented_command_uses_flags_its_mode_accepts():
    modes, wrong, seen = _modes(), [], 0
    for where, mode, rest in _commands():
        seen += 1
        for flag in re.findall(r"(?<![\w.])(--[a-zA-Z_][\w-]*)(?![\w.])", rest):
            if flag not in modes[mode]:
                wrong.append(f"{where}: samtone {mode} has no {flag}")
    assert seen > 40, "the pattern no longer finds the documented commands"
    assert not wrong, "\n".join(wrong)


def _parameters() -> dict[str, set[str] | None]:
    out = {}
    for selector in list(gin.config._REGISTRY._selector_map):
        configurable = gin.config._REGISTRY[selector]
        try:
            out[configurable.name] = set(inspect.signature(configurable.wrapped).parameters)
        except (TypeError, ValueError):
            out[configurable.name] = None
    return out


GIN_NAMES = (
    re.compile(r"--gin\.([A-Za-z_]\w*)\.([a-z_]\w*)="),  # a command line's override
    re.compile(r"^\s*([A-Za-z_]\w*)\.([a-z_]\w*)\s*="),  # a binding in a gin file or a docs block
    re.compile(r"gin `([A-Za-z_]\w*)\.([a-z_]\w*)"),  # prose: "gin `data_dir.path`"
)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_gin_name_is_a_parameter(path):
    known, wrong = _parameters(), []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for pattern in GIN_NAMES:
            for name, parameter in pattern.findall(line):
                if name not in known:
                    wrong.append(f"{path.relative_to(REPO)}:{number}: {name}.{parameter}: no such gin configurable")
                elif known[name] is not None and parameter not in known[name]:
                    wrong.append(f"{path.relative_to(REPO)}:{number}: {name} has no parameter {parameter!r}")
    assert not wrong, "\n".join(wrong)


def test_the_readme_is_short_and_user_docs_cite_no_issue_numbers():
    """README.md is read in five minutes (≤ 200 lines); the tracker's issue numbers appear only in
    docs/CHANGELOG.md, never in the docs a user reads."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 200
    citing = [
        f"{path.relative_to(REPO)}:{number}"
        for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
        if path.name != "CHANGELOG.md"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bissues? \d+", line, re.IGNORECASE)
    ]
    assert citing == [], "move what an issue did to docs/CHANGELOG.md; say what the code does instead"


def test_the_readme_links_only_docs_that_exist():
    named = set(re.findall(r"docs/[A-Z]+\.md", (REPO / "README.md").read_text()))
    assert named and all((REPO / name).exists() for name in named), sorted(n for n in named if not (REPO / n).exists())


def test_every_plain_flag_of_a_table_sets_a_real_gin_parameter():
    """The plain-flag tables (cli/flags.py: GinFlag) map each flag onto a gin parameter that exists,
    so a flag can never bind a name gin would refuse or ignore; and every mode that reads a model
    spells it --checkpoint."""
    known, wrong, seen = _parameters(), [], 0
    for mode in cli.MODES:
        for flag in getattr(mode, "FLAGS", ()):
            seen += 1
            name, _, parameter = flag.gin.rpartition(".")
            if name not in known or (known[name] is not None and parameter not in known[name]):
                wrong.append(f"{mode.NAME} {flag.flag} -> {flag.gin}: no such gin parameter")
    assert seen >= 20 and not wrong, "\n".join(wrong)
    modes = _modes()
    for mode in (
        "import-checkpoint",
        "train",
        "eval",
        "calibrate",
        "average",
        "encode",
        "analyze",
        "export",
        "mine",
        "score",
    ):
        assert "--checkpoint" in modes[mode], mode
