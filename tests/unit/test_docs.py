"""README.md and docs/ say what the code does: the CRD reference is current, the README's
commands exist (make targets, `strata` subcommands, files), its examples use real CRD fields,
its `kubectl get` columns are the CRDs' and its Performance section shows the newest results.

What this cannot check: that commands needing a Kubernetes cluster or Docker succeed (the
e2e suite installs the chart; no Docker engine runs here).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from loadfile import load_file
import yaml

from strata.cacheserver.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def _load_script(name: str) -> ModuleType:
    path = REPO / "scripts" / name
    return load_file(path, f"strata_script_{path.stem.replace('-', '_')}")


crd_reference = _load_script("gen-crd-reference.py")
readme_performance = _load_script("gen-readme-performance.py")


def code_blocks(text: str, *languages: str) -> list[str]:
    """Fenced code blocks of the given info strings ("" for none)."""
    blocks = re.findall(r"^```([a-z]*)\n(.*?)^```", text, re.S | re.M)
    return [body for lang, body in blocks if lang in languages]


def shell_commands(text: str) -> list[list[str]]:
    """Every command in sh blocks and `$ ` lines of transcripts, split like a shell would
    (comments dropped, `&&` chains split)."""
    lines = []
    for block in code_blocks(text, "sh"):
        lines += [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    for block in code_blocks(text, ""):
        lines += [ln[2:] for ln in block.splitlines() if ln.startswith("$ ")]
    commands = []
    for line in lines:
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in words:
            if word in ("&&", "||", ";", "|"):
                commands.append(current)
                current = []
            else:
                current.append(word)
        commands.append(current)
    return [c for c in commands if c]


@pytest.fixture(scope="module")
def readme() -> str:
    return README.read_text()


# -- generated parts are current ---------------------------------------------------------------

def test_crd_reference_is_current() -> None:
    expected = crd_reference.render(crd_reference.load_crds())
    current = crd_reference.OUTPUT.read_text() if crd_reference.OUTPUT.exists() else ""
    assert current == expected, "docs/crd-reference.md is stale: run .venv/bin/python -P scripts/gen-crd-reference.py"


def test_crd_reference_names_every_field_of_every_crd() -> None:
    text = crd_reference.OUTPUT.read_text()
    for crd in crd_reference.load_crds():
        for version in crd["spec"]["versions"]:
            for field in crd_reference.walk(version["schema"]["openAPIV3Schema"]):
                assert f"| `{field.path}` |" in text, f"{crd['metadata']['name']}: {field.path} missing"
    # spot checks against the schema as a person reads it
    assert "| `spec.tiers[].medium` | string |  | Storage medium of the tier. Required. One of `MEM`, `SSD`, `HDD`. |" in text
    assert "| `spec.cachePolicy.highWatermark` | number | `0.95` |" in text
    assert "Range: 0 < value <= 1." in text
    assert "| `spec.path` | string |" in text and "Immutable." in text


def test_crd_reference_escapes_markdown() -> None:
    assert crd_reference._cell("a || b <name> `x|<y>`") == "a \\|\\| b &lt;name> `x\\|<y>`"


def test_readme_performance_section_is_current(readme: str) -> None:
    expected = readme_performance.render(readme, readme_performance.newest_result())
    assert readme == expected, "README.md's Performance section is stale: run .venv/bin/python -P scripts/gen-readme-performance.py"


def test_performance_section_prefers_the_newest_full_run(tmp_path: Path) -> None:
    for name, quick, started in (("old-full", False, "2026-01-01"), ("new-full", False, "2026-02-01"),
                                 ("newer-quick", True, "2026-03-01"), ("newest-partial", False, "2026-04-01")):
        partial = str(name.endswith("partial")).lower()  # a run of some workloads only (--only) is never shown
        (tmp_path / f"{name}.json").write_text(f'{{"quick": {str(quick).lower()}, "started": "{started}", '
                                               f'"partial": {partial}}}')
        (tmp_path / f"{name}.md").write_text(f"# {name}\n\n- started {started}\n\n## Targets\n\n| a |\n|---|\n")
    assert readme_performance.newest_result(tmp_path) == tmp_path / "new-full.md"
    (tmp_path / "new-full.md").unlink()
    (tmp_path / "old-full.md").unlink()
    assert readme_performance.newest_result(tmp_path) == tmp_path / "newer-quick.md"
    assert readme_performance.newest_result(tmp_path / "missing") is None


# -- the README's commands exist ---------------------------------------------------------------

def test_readme_links_the_crd_reference(readme: str) -> None:
    assert "(docs/crd-reference.md)" in readme


def test_readme_starts_with_the_two_commands(readme: str) -> None:
    first = code_blocks(readme, "sh")[0]
    assert [ln.split("#")[0].strip() for ln in first.splitlines()] == ["make demo", "make test"]


def test_make_targets_in_the_readme_exist(readme: str) -> None:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", makefile, re.M))
    used = {c[1] for c in shell_commands(readme) if c[0] == "make" and len(c) > 1}
    used |= set(re.findall(r"`make ([a-z][\w-]*)", readme))
    assert {"demo", "test"} <= used
    assert used <= targets, f"README names make targets the Makefile lacks: {sorted(used - targets)}"


def test_strata_commands_in_the_readme_parse(readme: str) -> None:
    commands = [c[1:] for c in shell_commands(readme) if c[0] == "strata"]
    assert len(commands) >= 8
    parser = build_parser()
    for argv in commands:
        try:
            parser.parse_args(argv)
        except SystemExit as exc:  # argparse reports a bad command by exiting 2
            raise AssertionError(f"README: `strata {' '.join(argv)}` does not parse") from exc
    subcommands = {" ".join(c[:2]) for c in commands}
    for needed in ("local up", "local down", "mount add", "fs ls", "fs cat", "fs load"):
        assert needed in subcommands, f"README shows no `strata {needed}`"
    assert any(c[0] == "report" for c in commands)


def test_paths_in_the_readme_exist(readme: str) -> None:
    mentioned = set(re.findall(r"\]\(((?!https?:|#)[^)]+)\)", readme))          # markdown links
    folders = ("bench/", "cacheserver/", "charts/", "contract/", "crds/", "docs/", "manifests/", "operator/", "scripts/", "tests/")
    for command in shell_commands(readme):
        mentioned |= {w for w in command if w.startswith(folders) or w.startswith("Dockerfile.")}
    assert "manifests/install.yaml" in mentioned and "charts/strata" in mentioned
    missing = sorted(m for m in mentioned if not (REPO / m).exists())
    assert not missing, f"README names files that do not exist: {missing}"


def test_python_examples_compile(readme: str) -> None:
    blocks = code_blocks(readme, "python")
    assert blocks
    for block in blocks:
        compile(block, "README.md", "exec")


# -- the README's examples match the CRDs ------------------------------------------------------

def _schemas() -> dict[str, dict[str, Any]]:
    return {c["spec"]["names"]["kind"]: c for c in crd_reference.load_crds()}


def _check_fields(value: Any, schema: dict[str, Any], where: str) -> None:
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} is not one of {schema['enum']}"
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
            return
        extra = schema.get("additionalProperties")
        for key, child in value.items():
            if key in schema.get("properties", {}):
                _check_fields(child, schema["properties"][key], f"{where}.{key}")
            elif isinstance(extra, dict):
                _check_fields(child, extra, f"{where}.{key}")
            else:
                raise AssertionError(f"{where}.{key} is not a field of the CRD")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_fields(item, schema.get("items", {}), f"{where}[{i}]")


def test_yaml_examples_use_real_crd_fields(readme: str) -> None:
    schemas = _schemas()
    checked = set()
    for block in code_blocks(readme, "yaml"):
        for doc in yaml.safe_load_all(block):
            if doc.get("apiVersion", "").startswith("strata.dev/"):
                version = schemas[doc["kind"]]["spec"]["versions"][0]
                _check_fields(doc["spec"], version["schema"]["openAPIV3Schema"]["properties"]["spec"], doc["kind"])
                checked.add(doc["kind"])
            elif doc.get("kind") == "Pod":
                volume = doc["spec"]["volumes"][0]["csi"]
                assert volume["driver"] == "csi.strata.dev"
                checked.add("Pod")
    assert checked == {"CacheCluster", "Mount", "Pod"}


def test_yaml_examples_match_the_example_files(readme: str) -> None:
    """The README shows the files in manifests/examples/ (the CacheCluster shortened)."""
    def specs(path: Path) -> dict[str, Any]:
        return {d["kind"]: d for d in yaml.safe_load_all(path.read_text()) if d}

    shown: dict[str, Any] = {}
    for block in code_blocks(readme, "yaml"):
        shown |= {d["kind"]: d for d in yaml.safe_load_all(block) if d}
    examples = REPO / "manifests" / "examples"
    mount_file = specs(examples / "mount-s3.yaml")
    for kind in ("Secret", "Mount"):
        file_spec = mount_file[kind].get("spec", mount_file[kind].get("stringData"))
        shown_spec = shown[kind].get("spec", shown[kind].get("stringData"))
        # Defaults may be left out of the README, never changed.
        assert all(file_spec[k] == v for k, v in shown_spec.items()), kind
    assert shown["Pod"] == specs(examples / "pod.yaml")["Pod"]
    cluster = specs(examples / "cachecluster.yaml")["CacheCluster"]["spec"]
    assert shown["CacheCluster"]["spec"]["tiers"] == cluster["tiers"]
    assert shown["CacheCluster"]["spec"]["worker"]["replicas"] == cluster["worker"]["replicas"]


def test_kubectl_get_columns_are_the_crds(readme: str) -> None:
    schemas = _schemas()
    for kind, command in (("CacheCluster", "kubectl get cacheclusters"), ("Mount", "kubectl get mounts.strata.dev")):
        version = schemas[kind]["spec"]["versions"][0]
        header = ["NAME"] + [c["name"].upper() for c in version["additionalPrinterColumns"]]
        assert command in readme
        tables = [b for b in code_blocks(readme, "") if b.startswith("NAME ")]
        first_lines = [re.split(r"\s{2,}", b.splitlines()[0].strip()) for b in tables]
        assert header in first_lines, f"README shows no `{command}` table with columns {header}"
