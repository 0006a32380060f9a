"""The cascade's escalation rule: when is the small tier's answer not good enough to keep?

Escalate when any holds:
- the answer is empty (only whitespace);
- its mean token log-probability is below `min_mean_logprob` (the small model was unsure);
- code was asked for and a fenced Python block does not parse.
"""

from __future__ import annotations

from localspec.router.answers import code_blocks, parses

# exp(-0.5) ~ 0.61: the small model's average token probability; below it, answers are often wrong.
DEFAULT_MIN_MEAN_LOGPROB = -0.5


def should_escalate(mean_logprob: float | None, text: str, asked_code: bool = False,
                    min_mean_logprob: float = DEFAULT_MIN_MEAN_LOGPROB) -> tuple[bool, str]:
    """(escalate?, one-line reason)."""
    if not text.strip():
        return True, "the small tier's answer is empty"
    if mean_logprob is not None and mean_logprob < min_mean_logprob:
        return True, f"low confidence: mean logprob {mean_logprob:.2f} < {min_mean_logprob:.2f}"
    if asked_code:
        for lang, body in code_blocks(text):
            if lang in ("", "python", "py", "python3") and not parses(body):
                return True, "the code block does not parse"
    conf = f"mean logprob {mean_logprob:.2f}" if mean_logprob is not None else "no logprobs"
    return False, f"kept the small tier's answer ({conf})"
