"""bench/replay_eval.py answers a replayed call with the walked trajectory's own output.

The same call can return other things in another task's state (BFCL's long-context copies pad the
outputs of the very same calls: 19 characters in one copy, 12,690 in another). Answering from the
first trajectory that made the call put the short output in the replay block while the harness
took the long result out of the conversation: a token saving that never happened."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _harness():
    spec = importlib.util.spec_from_file_location("replay_eval_under_test", HERE / "bench" / "replay_eval.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (its dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


def _traj(task_id: int, out: str) -> dict:
    return {"task_id": task_id, "trial": 0, "messages": [
        {"role": "user", "content": "how far?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "name": "estimate_distance",
                                                               "args": {"cityA": "94016", "cityB": "83214"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "estimate_distance", "content": out},
    ]}


def test_exec_answers_from_the_walked_trajectory_first():
    mod = _harness()
    short, padded = '{"distance": 980.0}', '{"distance": 980.0, "pad": "' + "x" * 500 + '"}'
    a, b = _traj(1, short), _traj(2, padded)
    h = mod.Harness(None, None, [a, b], set(), 0)
    args = {"cityA": "94016", "cityB": "83214"}
    h.walking(b)
    assert h.exec("estimate_distance", args) == padded
    h.walking(a)
    assert h.exec("estimate_distance", args) == short


def test_exec_falls_back_to_any_trajectory_for_a_call_the_walked_one_did_not_make():
    mod = _harness()
    a = _traj(1, '{"distance": 980.0}')
    other = {"task_id": 3, "trial": 0, "messages": [{"role": "user", "content": "hi"}]}
    h = mod.Harness(None, None, [a, other], set(), 0)
    h.walking(other)
    assert h.exec("estimate_distance", {"cityA": "94016", "cityB": "83214"}) == '{"distance": 980.0}'
