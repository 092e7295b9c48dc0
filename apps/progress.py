"""Progress bars for long commands (distill, train): tqdm on stderr when a person watches it,
plain log lines when stderr goes to a file."""

from __future__ import annotations

import sys


def stderr_line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def shows_bar(quiet: bool = False) -> bool:
    """A bar only for a person watching: not under --quiet, not when stderr is a file or pipe
    (a log then gets the commands' plain lines instead)."""
    return not quiet and sys.stderr.isatty()


class Progress:
    """A tqdm bar on stderr (where `shows_bar` says so), made at the first update so that it
    starts where a resumed run does; `log` prints lines above it, or plainly without one."""

    def __init__(self, unit: str, desc: str, quiet: bool = False):
        self.unit, self.desc, self.quiet, self.bar = unit, desc, quiet, None

    def update(self, done: int, total: int, first: int = 0, **postfix) -> None:
        """`done` of `total` units; `first`: units done before this run; postfix: values shown
        beside the bar, in order."""
        if self.bar is None:
            if not shows_bar(self.quiet):
                return
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                initial=first,
                unit=self.unit,
                desc=self.desc,
                file=sys.stderr,
                dynamic_ncols=True,
                smoothing=0.05,  # a long run: the ETA follows the average, not the last updates
            )
        self.bar.set_postfix(ordered_dict=postfix, refresh=False)
        self.bar.update(done - self.bar.n)

    def log(self, line: str) -> None:
        if self.bar is None:
            stderr_line(line)
        else:
            self.bar.write(line, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
