"""One self-contained HTML page for a PTQ report: where accuracy goes, what the budget search tried,
how the written model did on each backend.

Plots (matplotlib, imported only for a page that has one, embedded as PNG): the output error
each layer causes when quantized alone, and the budget's candidates (metric against the number
of layers kept float, with the latency each candidate measured on the chosen backend relative
to float, when measured; a sentence when there was one candidate). Tables: the verification per
backend and the samples it ran on, the layers kept float and why, and what ``algo="auto"`` /
AdaRound chose per layer.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any


def _pyplot() -> Any:
    """matplotlib's pyplot, rendering to memory (matplotlib takes a while to import: only pages with a plot do)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render to memory only
    import matplotlib.pyplot as plt

    return plt


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    _pyplot().close(figure)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def _sensitivity_plot(sensitivity: list[dict[str, Any]]) -> str:
    figure, axis = _pyplot().subplots(figsize=(8, 0.28 * len(sensitivity) + 1.2))
    labels = [f"{s['op']} {s.get('weight') or s['scope']}" for s in sensitivity][::-1]
    axis.barh(labels, [max(s["output_error"], 1e-12) for s in sensitivity][::-1], color="#c0504d")
    axis.set_xscale("log")
    axis.set_xlabel("model output error (relative L2) with only this layer quantized")
    axis.tick_params(axis="y", labelsize=7)
    return _png(figure)


def _candidates(budget: dict[str, Any]) -> str:
    candidates = budget["candidates"]
    if len(candidates) == 1:  # a plot of one point has no axis worth reading
        only = candidates[0]
        latency = f", latency {only['measured']:.2f}x float" if "measured" in only else ""
        return (f"<p>One candidate was tried: {only['float_layers']} layers kept float, {budget['metric']} "
                f"{only['score']:.4g}{latency}.</p>")
    figure, axis = _pyplot().subplots(figsize=(8, 3.6))
    ks = [c["float_layers"] for c in candidates]
    axis.plot(ks, [c["score"] for c in candidates], "o-", color="#1f4e79", label=budget["metric"])
    if budget["metric"] == "eval_function":
        axis.axhline(budget["float_score"], color="#1f4e79", ls=":", label="float")
        axis.axhline(budget["float_score"] - budget["limit"], color="#999999", ls="--", label="budget")
    else:
        axis.axhline(budget["limit"], color="#999999", ls="--", label="budget")
    axis.set_xlabel("layers kept float (most sensitive first)")
    axis.set_ylabel(budget["metric"])
    handles = axis.get_legend_handles_labels()[0]
    measured = [(c["float_layers"], c["measured"]) for c in candidates if "measured" in c]
    if measured:
        other = axis.twinx()
        handles += other.plot(*zip(*measured), "s--", color="#c55a11", label="latency / float (right axis)")
        other.set_ylabel("latency relative to float", color="#c55a11")
    axis.legend(handles=handles, loc="best", fontsize=8)
    return _png(figure)


def _rows(cells: list[list[Any]]) -> str:
    return "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in cells)


def _verification(report: dict[str, Any]) -> str:
    """The written model per backend (as ``qcli ptq`` prints it) and the samples it ran on, or why there is none."""
    if "verification_failed" in report:
        return f"<p>Verifying the written model failed: {html.escape(report['verification_failed'])}</p>"
    on = html.escape(str(report.get("verified_on", "")))
    if not report.get("verified"):
        return f"<p>Not verified: {on}</p>"
    rows = []
    for backend, row in report["verified"].items():
        if "unavailable" in row:
            rows.append(f"<tr><td>{html.escape(backend)}</td><td colspan='6'>{html.escape(row['unavailable'])}</td>"
                        "</tr>")
        else:
            rows.append(_rows([[backend, f"{row['float_ms']:.2f}", f"{row['int8_ms']:.2f}", f"{row['speedup']:.2f}x",
                                f"{row['deployed_vs_simulated']:.2e}", f"{row['int8_vs_float']:.2e}",
                                f"{row['agreement_with_float']:.1f}"]]))
    return (f"<p>On {on}.</p><table><tr><th>backend</th><th>float ms</th><th>int8 ms</th><th>speed-up</th>"
            "<th>deployed vs simulated</th><th>int8 vs float</th><th>agreement %</th></tr>" + "".join(rows) +
            "</table>")


def render(report: dict[str, Any]) -> str:
    """The page for a ``qcli ptq static`` report (its JSON, as written next to the model)."""
    parts = [f"<h1>PTQ report: {html.escape(str(report.get('model', '')))}</h1>",
             f"<p>algo <b>{html.escape(str(report.get('algo')))}</b>, deploy backend "
             f"<b>{html.escape(str(report.get('deploy_backend') or 'default (oneDNN rules)'))}</b>, "
             f"{report.get('batches')} calibration batches, {report.get('seconds')} s.</p>"]
    budget = report.get("budget")
    if budget:
        verdict = "met" if budget["met"] else "NOT met (best candidate saved)"
        parts += [f"<h2>Accuracy budget: {verdict}</h2>",
                  f"<p>{budget['metric']} limit {budget['limit']}, float score {budget['float_score']:.4g}, "
                  f"{budget['float_layers']} layers kept float, {budget['evaluations']} evaluations, "
                  f"{budget['seconds']} s.</p>", _candidates(budget),
                  "<h2>Layer sensitivity</h2>", _sensitivity_plot(budget["sensitivity"])]
    parts += ["<h2>Verification</h2>", _verification(report)]
    kept = [[layer["op"], layer.get("scope", ""), layer["left_float"]]
            for layer in report.get("layers", []) if "left_float" in layer]
    parts += ["<h2>Layers kept float</h2>",
              f"<table><tr><th>op</th><th>scope</th><th>why</th></tr>{_rows(kept)}</table>" if kept else "<p>none</p>"]
    chosen = [[layer["op"], name, info["auto"]["algo"], f"{info['threshold']:.4g}"]
              for layer in report.get("layers", []) for name, info in layer.get("inputs", {}).items()
              if "auto" in info]
    if chosen:
        parts += ["<h2>algo=auto: threshold per activation</h2>",
                  f"<table><tr><th>op</th><th>activation</th><th>chosen algo</th><th>threshold</th></tr>"
                  f"{_rows(chosen)}</table>"]
    rounded = [[layer["op"], layer["weight"]["name"], layer["weight"]["adaround"]["loss_nearest"],
                layer["weight"]["adaround"]["loss_adaround"], layer["weight"]["adaround"]["used"]]
               for layer in report.get("layers", []) if "adaround" in layer.get("weight", {})]
    if rounded:
        parts += ["<h2>AdaRound</h2>", "<table><tr><th>op</th><th>weight</th><th>loss, nearest</th>"
                  f"<th>loss, AdaRound</th><th>used</th></tr>{_rows(rounded)}</table>"]
    style = "body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:2px 8px;text-align:left}"
    return f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head><body>{''.join(parts)}" \
           "</body></html>"
