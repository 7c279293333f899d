"""What a driver says when its experiment is interrupted (Ctrl+C): the line that resumes it,
said once (:func:`say_interrupted`, which marks the exception with
:data:`RESUME_LINE_PRINTED` so that a script that does not catch it ends on that line).
"""

from __future__ import annotations

import sys

__all__ = ["RESUME_LINE_PRINTED", "say_interrupted"]

#: Set (True) on a KeyboardInterrupt once the controller printed the line that resumes the
#: experiment: a script that does not catch it has nothing more to say.
RESUME_LINE_PRINTED = "_ftnb_resume_line_printed"


def say_interrupted(exc: KeyboardInterrupt, name: str, resume_hint: str, what: str) -> None:
    """Print the line that resumes the interrupted experiment ``name`` (``what`` says what was
    done), and mark ``exc`` so that a script that does not catch it ends on that line."""
    print(f"\nftnb: experiment {name!r} interrupted; {what}. Resume it with:\n    {resume_hint}",
          file=sys.stderr, flush=True)
    setattr(exc, RESUME_LINE_PRINTED, True)  # see Tuner.fit
