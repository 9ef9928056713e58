"""The one rule for text that is not valid Unicode: a lone surrogate becomes U+FFFD."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from crosstalk.core.ids import new_message_id
from crosstalk.core.message import Ingress, Message, Sender, valid_unicode, with_valid_unicode
from crosstalk.core.records import MessageSubmitted, parse_record

CODE_POINTS = st.one_of(st.characters(exclude_categories=()),
                        st.sampled_from(["\ud83d", "\ude00", "\udbff", "\udc00", "\x00"]))
ANY_TEXT = st.lists(CODE_POINTS, max_size=60).map("".join)
SENDER = Sender(agent_id=None, ingress=Ingress.UDS, peer_pid=1)


def test_lone_surrogates_become_the_replacement_character() -> None:
    assert valid_unicode("a\ud83d b\ude00") == "a\ufffd b\ufffd"
    assert valid_unicode("\ud83d\ude00") == "\U0001f600"  # a pair is its character
    assert valid_unicode("nul \x00 kept") == "nul \x00 kept"
    assert valid_unicode("ascii") == "ascii"


@given(ANY_TEXT)
def test_the_result_always_encodes_and_valid_text_is_unchanged(text: str) -> None:
    good = valid_unicode(text)
    good.encode("utf-8")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        assert "\ufffd" in good or len(good) < len(text)
    else:
        assert good == text


@given(ANY_TEXT, st.dictionaries(ANY_TEXT, ANY_TEXT, max_size=3))
def test_a_repaired_message_names_what_was_repaired_and_journals_it(
        text: str, asserted: dict[str, str]) -> None:
    msg = Message(message_id=new_message_id(), sender=SENDER, text=text, asserted=asserted)
    fixed = with_valid_unicode(msg)
    fixed.text.encode("utf-8")
    assert ("text" in fixed.repaired) == (fixed.text != text)
    assert ("asserted" in fixed.repaired) == (fixed.asserted != asserted)
    record = MessageSubmitted.of(fixed, None).to_dict()
    back = parse_record(record)
    assert isinstance(back, MessageSubmitted)
    assert back.repaired == fixed.repaired
    rebuilt = back.message()
    assert rebuilt is not None
    assert rebuilt.text == fixed.text
    assert rebuilt.repaired == fixed.repaired
