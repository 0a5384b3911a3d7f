"""Compare two pytest runs' outcomes, test by test (their ``--junitxml`` files).

    python .ci/compare_outcomes.py WITH.xml WITHOUT.xml

Prints the counts of each run and every test whose outcome differs; exits 1 if any does.
Uses the standard library only (it runs where asynccube is not installed).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def outcomes(path: str) -> dict[str, str]:
    """Test id -> passed | failed | error | skipped."""
    result: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(
            kinds[0] if kinds else "", "passed"
        )
        if test in result and outcome == "passed":
            continue  # a teardown error is reported as a second testcase element
        result[test] = outcome
    return result


def main() -> int:
    """Compare and report (see the module docstring)."""
    missing = [path for path in sys.argv[1:3] if not Path(path).is_file()]
    if missing:
        print(f"  no report (the run did not start): {', '.join(missing)}")
        return 1
    with_, without = outcomes(sys.argv[1]), outcomes(sys.argv[2])
    print(f"with asynccube:    {dict(Counter(with_.values()))}")
    print(f"without asynccube: {dict(Counter(without.values()))}")
    differ = sorted(
        (test, with_.get(test, "absent"), without.get(test, "absent"))
        for test in with_.keys() | without.keys()
        if with_.get(test) != without.get(test)
    )
    for test, a, b in differ:
        print(f"  {test}: {a} with asynccube, {b} without")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
