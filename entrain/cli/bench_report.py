"""``entrain bench paper``'s targets and report.

The paper's values come from ``entrain/cli/paper/figures.json`` and the report's wording from the
template ``entrain/cli/paper/report.md.j2``; this module only computes, from one run's results, the
numbers and yes/no facts the template states (``report_context``). A sentence the template prints
is either a description of the setup or a fact computed here.
"""

from __future__ import annotations

import functools
import json
import statistics
from importlib import resources

import jinja2

from entrain.core.planning.baselines import PAPER_TABLE1
from entrain.core.systems import DIP, DISTTRAIN, DISTTRAIN_PAPER, ENTRAIN, ENTRAIN_1F1B, SYSTEMS
from entrain.sim.ablation import DIP_GREEDY_STEPS

SHORT = {"qwen25vl-llama3-1b": "1B", "qwen25vl-llama3-3b": "3B"}
BASELINES = tuple(n for n, spec in SYSTEMS.items() if not spec.extensions)
"""The registry's systems that are not Entrain (Entrain's own accept its extensions)."""
PAPER = "entrain-paper"
ENTRAINS = {ENTRAIN: "Entrain", PAPER: "Entrain (paper: no extensions)"}
"""``entrain`` = our default (the extensions where the cost model predicts a gain)."""
EXTENSIONS = ("entrain+ramp", "entrain+shared", "entrain+split")
COLOCATED = tuple(n for n, spec in SYSTEMS.items() if spec.colocated)
"""DIP and its variants (the registry's colocated systems)."""
FIG11_COLUMNS = (ENTRAIN, PAPER, *EXTENSIONS, *(n for n in SYSTEMS if n != ENTRAIN))
FIG13_SYSTEMS = (DISTTRAIN, *COLOCATED, PAPER, ENTRAIN, ENTRAIN_1F1B)
SPLITS = tuple(f"{e}:{8 - e}" for e in range(1, 8))


@functools.cache
def paper_figures() -> dict:
    """The paper's values (package data ``cli/paper/figures.json``)."""
    return json.loads(resources.files(__package__).joinpath("paper/figures.json").read_text())


def case_key(case: dict) -> str:
    return f"{case['dataset']}/{SHORT[case['model']]}"


def time_ms(case: dict, name: str) -> float:
    return case["systems"][name]["iteration_time_ms"]


def ratio(case: dict, num: str, den: str = ENTRAIN) -> float:
    return time_ms(case, num) / time_ms(case, den)


def oom(case: dict, name: str) -> bool:
    return case["systems"].get(name, {}).get("fits_memory") is False


def best_dip(case: dict) -> str:
    return min((n for n in COLOCATED if n in case["systems"]), key=lambda n: time_ms(case, n))


def rng(xs, digits: int = 2) -> str:
    xs = list(xs)
    if not xs:
        return "-"
    lo, hi = f"{min(xs):.{digits}f}", f"{max(xs):.{digits}f}"
    return lo if lo == hi else f"{lo}–{hi}"


# --- targets -----------------------------------------------------------------------------------------
def targets(cases: list[dict]) -> list[dict]:
    """Every target (thresholds from ``figures.json``) for Entrain and Entrain as the paper, per case."""
    out = []
    for c in cases:
        for who in ENTRAINS:
            if who in c["systems"]:
                out += _case_targets(c, who)
    return out


def _row(target: str, case: dict, value: str, met: bool, **extra) -> dict:
    tag = f"{case['dataset']} + {SHORT[case['model']]} ({case['hardware']})"
    return {"target": target, "case": tag, "value": value, "met": bool(met), **extra}


def _case_targets(c: dict, who: str) -> list[dict]:
    goal, s = paper_figures()["targets"], c["systems"]
    label = ENTRAINS[who] + (" [OOM]" if oom(c, who) else "")
    rivals = [n for n in BASELINES if n in s]
    closest = min(rivals, key=lambda n: time_ms(c, n))
    fitting = [n for n in rivals if not oom(c, n)]
    rows = [
        _row(f"{label} faster than every baseline", c, f"closest: {closest} {ratio(c, closest, who):.3f}x",
             all(ratio(c, n, who) > 1 for n in rivals),
             met_excluding_oom=all(ratio(c, n, who) > 1 for n in fitting)),
        _row(f"{label} within {goal['max_over_busy_lower_bound']:.2f}x of the busy-time lower bound", c,
             f"{time_ms(c, who) / s[who]['lower_bound_ms']:.3f}x",
             time_ms(c, who) <= goal["max_over_busy_lower_bound"] * s[who]["lower_bound_ms"]),
    ]  # fmt: skip
    if case_key(c) == goal["speedup_case"]:
        dip = best_dip(c)
        rows += [
            _row(f"{label} >= {goal['speedup_vs_disttrain']:.2f}x vs disttrain", c,
                 f"{ratio(c, DISTTRAIN, who):.3f}x", ratio(c, DISTTRAIN, who) >= goal["speedup_vs_disttrain"]),
            _row(f"{label} >= {goal['speedup_vs_best_dip']:.2f}x vs the better DIP", c,
                 f"{ratio(c, dip, who):.3f}x ({dip}" + (", OOM)" if oom(c, dip) else ")"),
                 ratio(c, dip, who) >= goal["speedup_vs_best_dip"]),
        ]  # fmt: skip
    if c["dataset"] == goal["std_case_dataset"]:
        for key, need in goal["std_ratio_vs_disttrain"].items():
            r = s[DISTTRAIN][key] / max(s[who][key], 1e-9)
            rows.append(_row(f"{label} {key} >= {need:g}x below disttrain", c, f"{r:.1f}x", r >= need))
    return rows


# --- tables ----------------------------------------------------------------------------------------------
def target_rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for t in rows:
        fit = t.get("met_excluding_oom")
        fit_cell = "" if fit is None or fit == t["met"] else ("yes" if fit else "**no**")
        out.append([t["target"], t["case"], t["value"], "yes" if t["met"] else "**no**", fit_cell])
    return out


# --- more tables ------------------------------------------------------------------------------------------
def _cell(c: dict, name: str) -> str:
    text = f"{time_ms(c, name) / 1e3:.2f}"
    if name != ENTRAIN:
        text += f" ({ratio(c, name):.2f}x)"
    return text + (" **OOM**" if oom(c, name) else "")


def fig11_rows(cases: list[dict], names: list[str]) -> list[list[str]]:
    fig11 = paper_figures()["fig11_iteration_s"]["cases"]
    rows = []
    for c in cases:
        p = fig11.get(case_key(c))
        paper = f"{p[0]} / {p[1]} / {p[2]} ({min(p[0], p[1]) / p[2]:.2f}x)" if p else "-"
        ours = f"{ratio(c, DISTTRAIN):.2f}x / {ratio(c, best_dip(c)):.2f}x"
        rows.append([f"{c['dataset']} + {SHORT[c['model']]}", *(_cell(c, n) for n in names), paper, ours])
    return rows


def _paper_split(c: dict, system: str) -> str:
    return ":".join(map(str, PAPER_TABLE1.get((c["dataset"], c["model"]), {}).get(system, ()))) or "-"


def table1_rows(cases: list[dict]) -> list[list[str]]:
    rows = []
    for c in cases:
        s, pe = c["systems"], _paper_split(c, ENTRAIN)
        same = "same" if s[PAPER]["split"] == pe else "differs"
        rows.append([f"{c['dataset']} + {SHORT[c['model']]}", c["hardware"], f"{s[PAPER]['split']} / {pe} ({same})",
                     f"{s[DISTTRAIN]['split']} / {_paper_split(c, DISTTRAIN)}", f"{s[DIP]['split']} colocated"])  # fmt: skip
    return rows


def _trial_cell(t: dict | None) -> str:
    if t is None:
        return "-"
    seen = " ".join(f"{a}:{b}" for a, b in t["allocations_seen"])
    return (
        seen
        + ("*" if t.get("allocation_stable", len(t["allocations_seen"]) == 1) else "")
        + ("" if t["stable"] else " (unstable)")
    )


def trials_rows(cases: list[dict]) -> list[list[str]]:
    fig = paper_figures()["trials"]
    rows = []
    for c in cases:
        by = {t["batch_size"]: t for t in c["trials"]}
        converged = "yes" if c.get("b_min_converged", True) else "**no**"
        rows.append([f"{c['dataset']} + {SHORT[c['model']]}", c["hardware"],
                     *(_trial_cell(by.get(b)) for b in fig["sizes"]), str(c["b_min"]), converged])  # fmt: skip
        paper = fig["cases"].get(case_key(c))
        if paper and c["hardware"] == "a40-paper":
            rows.append(["↳ paper", "", *paper, "", ""])
    return rows


def table3_rows(cases: list[dict]) -> list[list[str]]:
    fig = paper_figures()["table3_fwd_std_ms"]["cases"]
    rows = []
    for c in cases:
        s, paper = c["systems"], fig.get(case_key(c), {})
        for i, (key, label) in enumerate((("encoder_fwd_std_ms", "vision"), ("llm_fwd_std_ms", "LLM"))):
            pv = {n: paper.get(n, (None, None))[i] for n in (DISTTRAIN, DIP, ENTRAIN)}
            cells = [f"{s[n][key]:.1f} / {'-' if pv[n] is None else f'{pv[n]:.2f}'}" for n in pv]
            pr = f"{pv[DISTTRAIN] / pv[ENTRAIN]:.1f}x" if pv[DISTTRAIN] and pv[ENTRAIN] else "-"
            ours = s[DISTTRAIN][key] / max(s[ENTRAIN][key], 1e-9)
            rows.append([f"{c['dataset']} + {SHORT[c['model']]}", label, *cells, f"{ours:.1f}x / {pr}"])
    return rows


def fig13_rows(cases: list[dict]) -> list[list[str]]:
    rows = []
    for c in cases:
        for n in (n for n in FIG13_SYSTEMS if n in c["systems"]):
            s = c["systems"][n]
            ranks = " ".join(f"{b / 1e9:.1f}" for b in s["peak_activation_bytes_per_rank"])
            total = s.get("peak_memory_bytes")
            cell = "-" if total is None else f"{total / 1e9:.1f}" + (" **OOM**" if oom(c, n) else "")
            rows.append(
                [
                    f"{c['dataset']} + {SHORT[c['model']]}",
                    n,
                    ranks,
                    f"{s['peak_activation_bytes'] / 1e9:.1f}",
                    cell,
                ]
            )
    return rows


def best_split(c: dict) -> str:
    valid = {k: v["iteration_time_ms"] for k, v in c["sweep"].items() if v}
    return min(valid, key=valid.get) if valid else "-"


def fig14_rows(cases: list[dict]) -> list[list[str]]:
    fig = paper_figures()["fig14_relative_time"]["cases"]
    rows = []
    for c in cases:
        sw, chosen = c["sweep"], c["systems"][PAPER]["split"]
        base = (sw.get(chosen) or {}).get("iteration_time_ms")
        cells = ["-" if not sw.get(k) or not base else
                 f"{sw[k]['iteration_time_ms'] / base:.2f}" + ("" if sw[k]["memory_ok"] else " (OOM)") for k in SPLITS]  # fmt: skip
        rows.append([f"{c['dataset']} + {SHORT[c['model']]}", chosen, *cells, best_split(c)])
        paper = fig.get(case_key(c))
        if paper:
            chosen_p = next(k for k, v in paper.items() if v == 1.0)
            rows.append(
                ["↳ paper", chosen_p, *("-" if k not in paper else f"{paper[k]:.2f}" for k in SPLITS), ""]
            )
    return rows


def gap_rows(cases: list[dict]) -> list[list[str]]:
    rows = []
    for c in cases:
        for key, who in (("gap_paper", "paper"), ("gap", "default")):
            g = c[key]
            rows.append([f"{c['dataset']} + {SHORT[c['model']]}", c["hardware"], who, f"{g['ideal_ms'] / 1e3:.2f}",
                         *(f"{g[k] / 1e3:+.2f}" for k in ("partition_granularity_ms", "microbatch_residual_ms",
                                                         "communication_ms")),
                         f"{g['iteration_time_ms'] / 1e3:.2f}"])  # fmt: skip
    return rows


# --- facts the summary states --------------------------------------------------------------------------
def ablation_rows(cases: list[dict]) -> list[list[str]]:
    """DIP-greedy's edge step by step (``sim.ablation.DIP_GREEDY_STEPS``), then Entrain, in seconds."""
    rows = []
    for c in cases:
        steps = c.get("dip_greedy_ablation")
        if steps:
            cells = [f"{v['iteration_time_ms'] / 1e3:.2f}" + (" OOM" if v["fits_memory"] is False else "")
                     for v in steps.values()]  # fmt: skip
            rows.append([case_key(c), c["hardware"], *cells, f"{time_ms(c, ENTRAIN) / 1e3:.2f}"])
    return rows


def wins(cases: list[dict], who: str, *, fitting: bool = False) -> int:
    """Cases where ``who`` beats every baseline (``fitting``: baselines that do not fit memory ignored)."""
    return sum(
        all(ratio(c, b, who) > 1 for b in BASELINES if b in c["systems"] and not (fitting and oom(c, b)))
        for c in cases
    )


def _by_hardware(cases: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for c in cases:
        out.setdefault(c["hardware"], []).append(c)
    return out


def _fitted(hardware: str) -> dict:
    return paper_figures()["fitted_presets"].get(hardware, {"fitted_to": [], "in_sample": []})


def win_facts(cases: list[dict]) -> list[dict]:
    return [{"hardware": hw, "label": label, "wins": wins(hc, who), "wins_fitting": wins(hc, who, fitting=True),
             "cases": len(hc)} for hw, hc in _by_hardware(cases).items() for who, label in ENTRAINS.items()]  # fmt: skip


def config_facts(cases: list[dict]) -> dict:
    matches = [{"hardware": hw, "same": sum(c["systems"][PAPER]["split"] == _paper_split(c, ENTRAIN) for c in hc),
                "cases": len(hc), "in_sample": "table1_entrain" in _fitted(hw)["in_sample"]}
               for hw, hc in _by_hardware(cases).items()]  # fmt: skip
    at_b_min = [next(t for t in c["trials"] if t["batch_size"] == c["b_min"]) for c in cases]
    return {
        "table1": matches,
        "b_min_range": rng([c["b_min"] for c in cases], 0),
        "converged": sum(c.get("b_min_converged", True) for c in cases),
        "paper_test_at_b_min": sum(t.get("allocation_stable", len(t["allocations_seen"]) == 1) for t in at_b_min),
        "cases": len(cases),
        "disttrain_same_as_entrain": sum(c["systems"][DISTTRAIN]["split"] == c["systems"][PAPER]["split"]
                                         for c in cases),
    }  # fmt: skip


def absolute_facts(cases: list[dict]) -> list[dict]:
    fig11 = paper_figures()["fig11_iteration_s"]["cases"]
    out = []
    for hw, hc in _by_hardware(cases).items():
        errs = [abs(time_ms(c, PAPER) / 1e3 / fig11[case_key(c)][2] - 1) for c in hc if case_key(c) in fig11]
        if errs:
            out.append({"hardware": hw, "max_pct": 100 * max(errs), "mean_pct": 100 * statistics.fmean(errs),
                        "cases": len(errs), "in_sample": "fig11_entrain" in _fitted(hw)["in_sample"]})  # fmt: skip
    return out


def ratio_facts(cases: list[dict]) -> dict:
    fig11 = [v for k, v in paper_figures()["fig11_iteration_s"]["cases"].items()]
    share = []
    for c in cases:
        counts = c["systems"][ENTRAIN].get("ramp_chosen_counts", {})
        total = sum(counts.values())
        share.append(100 * (1 - counts.get("0", 0) / total) if total else 0.0)
    return {
        "disttrain_vs_paper": rng(ratio(c, DISTTRAIN, PAPER) for c in cases),
        "disttrain_paper_vs_paper": rng(ratio(c, DISTTRAIN_PAPER, PAPER) for c in cases),
        "disttrain_vs_default": rng(ratio(c, DISTTRAIN) for c in cases),
        "paper_disttrain": rng(p[0] / p[2] for p in fig11),
        "paper_dip": rng(p[1] / p[2] for p in fig11),
        "colocated": {
            n: rng(ratio(c, n) for c in cases if n in c["systems"])
            for n in COLOCATED
            if any(n in c["systems"] for c in cases)
        },  # fmt: skip
        "extensions": {n: rng(ratio(c, n, PAPER) for c in cases if n in c["systems"]) for n in EXTENSIONS},
        "default_vs_paper": rng(ratio(c, ENTRAIN, PAPER) for c in cases),
        "ramp_share_pct": rng(share, 0),
        "shared_cases": sum(bool(c["systems"][ENTRAIN].get("shared_boundary")) for c in cases),
        "cases": len(cases),
    }


def memory_facts(cases: list[dict]) -> dict:
    names = [n for n in (ENTRAIN, PAPER, DISTTRAIN, *COLOCATED) if any(n in c["systems"] for c in cases)]
    misfits = {n: [f"{c['dataset']} + {SHORT[c['model']]} ({c['hardware']})" for c in cases if oom(c, n)]
               for n in names}  # fmt: skip
    fig = paper_figures()["fig13_last_rank_activation_gb"]
    case = next((c for c in cases if case_key(c) == fig["case"] and c["hardware"] == "a40-paper"), None)
    last = None
    if case is not None:
        gb = {
            n: case["systems"][n]["peak_activation_bytes_per_rank"][-1] / 1e9 for n in (DISTTRAIN, DIP, PAPER)
        }
        paper = {n: statistics.fmean(v) for n, v in fig["values"].items()}
        last = {"ours": gb, "paper": fig["values"], "case": fig["case"],
                "same_order": sorted(gb, key=gb.get) == sorted((DISTTRAIN, DIP, PAPER),
                                                                key=lambda n: paper[ENTRAIN if n == PAPER else n])}  # fmt: skip
    return {"misfits": misfits, "cases": len(cases), "last_rank": last}


def std_facts(cases: list[dict]) -> dict | None:
    goal, fig = paper_figures()["targets"], paper_figures()["table3_fwd_std_ms"]["cases"]
    syn = [c for c in cases if c["dataset"] == goal["std_case_dataset"]]
    if not syn:
        return None
    out = {}
    for i, key in enumerate(("encoder_fwd_std_ms", "llm_fwd_std_ms")):
        ours = [c["systems"][DISTTRAIN][key] / max(c["systems"][ENTRAIN][key], 1e-9) for c in syn]
        paper = [
            fig[case_key(c)][DISTTRAIN][i] / fig[case_key(c)][ENTRAIN][i] for c in syn if case_key(c) in fig
        ]
        out[key] = {"ours": rng(ours, 1), "paper": rng(paper, 1)}
    return out


def losses(cases: list[dict]) -> list[str]:
    return [f"{c['dataset']} + {SHORT[c['model']]} (`{c['hardware']}`) to `{n}` ({ratio(c, n):.3f}x)"
            for c in cases for n in BASELINES if n in c["systems"] and ratio(c, n) < 1]  # fmt: skip


def gap_facts(cases: list[dict]) -> dict:
    return {who: {k: rng((c[key][k] / 1e3 for c in cases), 2)
                  for k in ("partition_granularity_ms", "microbatch_residual_ms", "communication_ms")}
            for key, who in (("gap_paper", "paper"), ("gap", "default"))}  # fmt: skip


# --- rendering -----------------------------------------------------------------------------------------
def report_context(res: dict) -> dict:
    cases = res["cases"]
    paper_hw = [c for c in cases if c["hardware"] == "a40-paper"]
    swept = [c for c in cases if "sweep" in c]
    return {
        "res": res, "figures": paper_figures(), "splits": SPLITS, "target_rows": target_rows(res["targets"]),
        "trial_header": [f"b={b}" for b in paper_figures()["trials"]["sizes"]],
        "fig11": [{"hardware": hw, "names": [n for n in FIG11_COLUMNS if n in hc[0]["systems"]],
                   "rows": fig11_rows(hc, [n for n in FIG11_COLUMNS if n in hc[0]["systems"]]),
                   "in_sample": "fig11_entrain" in _fitted(hw)["in_sample"]} for hw, hc in _by_hardware(cases).items()],
        "table1": table1_rows(cases), "trials": trials_rows(cases), "table3": table3_rows(paper_hw),
        "fig13": fig13_rows(paper_hw), "fig14": fig14_rows(swept), "gap": gap_rows(cases),
        "ablation": ablation_rows(cases), "ablation_header": list(DIP_GREEDY_STEPS),
        "wins": win_facts(cases), "configs": config_facts(cases), "absolute": absolute_facts(cases),
        "ratios": ratio_facts(paper_hw or cases), "ratios_hardware": "a40-paper" if paper_hw else cases[0]["hardware"],
        "memory": memory_facts(cases), "std": std_facts(paper_hw), "losses": losses(cases),
        "profiled_best": sum(best_split(c) == c["systems"][PAPER]["split"] for c in swept), "swept": len(swept),
        "gaps": gap_facts(cases), "targets_met": sum(t["met"] for t in res["targets"]),
        "fitted": {hw: _fitted(hw) for hw in _by_hardware(cases)},
    }  # fmt: skip


def render(res: dict) -> str:
    """The markdown report of one ``bench paper`` run."""
    text = resources.files(__package__).joinpath("paper/report.md.j2").read_text()
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)  # fmt: skip
    return env.from_string(text).render(**report_context(res))
