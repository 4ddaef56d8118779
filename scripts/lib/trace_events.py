"""Reads a timeline written by `xla-spawn --trace FILE` for scripts/check-trace and
scripts/plot-trace. A trace is data from anywhere: every event is checked before it is used,
and a file of the wrong shape is a TraceError or a list of problems naming what is wrong,
never a traceback.

  tracks, spans, problems = trace_events.load("trace.json")   # raises TraceError
  # tracks: {pid: "ordinal 0"}; spans: complete events ("ph": "X") with a str name, ts and
  # dur >= 0 finite and within MAX_US, int pid and tid; problems: one line per event that was
  # left out (any event but ph M and X is one)
"""
import json
import math


class TraceError(Exception):
    pass


def _reject_constant(name):
    raise ValueError(f"{name} is not a JSON number")


# Microseconds: about 31 years. Beyond it a time is not one a trace of a job holds (and
# gnuplot cannot draw it).
MAX_US = 1e15


def _is_number(value):
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value)) and abs(value) <= MAX_US
    except OverflowError:  # an integer of hundreds of digits
        return False


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _short(event):
    text = json.dumps(event)
    return text if len(text) <= 200 else text[:200] + "..."


def load(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            doc = json.load(f, parse_constant=_reject_constant)
    except (OSError, ValueError, RecursionError) as e:
        raise TraceError(f"{path}: not readable trace-event JSON: {e}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents list")
    tracks, spans, problems = {}, [], []
    for e in events:
        if not isinstance(e, dict):
            problems.append(f"an event that is not an object: {_short(e)}")
            continue
        if e.get("ph") not in ("M", "X"):
            # xla-spawn writes complete spans and metadata only.
            problems.append(f"an event that is neither a complete span (ph X) nor metadata "
                            f"(ph M): {_short(e)}")
            continue
        if e.get("ph") == "M" and e.get("name") == "process_name":
            args = e.get("args")
            name = args.get("name") if isinstance(args, dict) else None
            if not _is_int(e.get("pid")) or not isinstance(name, str):
                problems.append(f"process_name without an integer pid and args.name: {_short(e)}")
            elif e["pid"] in tracks:
                problems.append(f"pid {e['pid']} is named twice: {tracks[e['pid']]!r}, {name!r}")
            else:
                tracks[e["pid"]] = name
        elif e.get("ph") == "X":
            missing = [k for k in ("name", "ts", "dur", "pid", "tid") if k not in e]
            if missing:
                problems.append(f"span without {missing[0]}: {_short(e)}")
            elif not isinstance(e["name"], str):
                problems.append(f"span whose name is not a string: {_short(e)}")
            elif not _is_number(e["ts"]) or not _is_number(e["dur"]):
                problems.append(f"span whose ts or dur is not a number within {MAX_US:.0e} us: "
                                f"{_short(e)}")
            elif not _is_int(e["pid"]) or not _is_int(e["tid"]):
                problems.append(f"span whose pid or tid is not an integer: {_short(e)}")
            elif e["dur"] < 0:
                problems.append(f"span with a negative duration: {_short(e)}")
            else:
                spans.append(e)
    return tracks, spans, problems
