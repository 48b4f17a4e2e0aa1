"""What `nearsight SUBCOMMAND --help` says about other commands: every `nearsight ...` it names
is a subcommand, with flags that subcommand has (help once named `eval --tune-rerank`)."""

from __future__ import annotations

import re

from tests.docs.usage import check_span, subcommands

MENTION = re.compile(r"nearsight [a-z][^();,`]*")


def wrong_mentions(text: str) -> list[str]:
    found = (check_span(m.strip()) for m in MENTION.findall(" ".join(text.split())))
    return [problem for problem in found if problem]


def test_help_names_only_flags_that_exist():
    problems = [
        f"nearsight {' '.join(words)} --help: {problem}"
        for words, parser in subcommands().items()
        for text in [parser.description, parser.epilog, *(a.help for a in parser._actions)]
        for problem in wrong_mentions(text or "")
    ]
    assert not problems, "\n".join(problems)


def test_a_wrong_flag_in_help_is_caught():
    assert wrong_mentions("the stored one (nearsight eval --tune-rerank ... --save), else none")
