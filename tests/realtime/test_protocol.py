import json

import pytest

from voicewire.realtime.protocol import (
    MAX_MESSAGE_BYTES,
    ProtocolError,
    SessionUpdate,
    TextDelta,
    TextEnd,
    TurnCancel,
    parse_client_message,
)

pytestmark = pytest.mark.shared_cores  # the messages' schema: nothing timed


def test_parses_every_client_message() -> None:
    assert parse_client_message('{"type":"text.delta","turn_id":"a","text":"hi"}') == TextDelta("a", "hi")
    assert parse_client_message('{"type":"text.end","turn_id":3}') == TextEnd(3)
    assert parse_client_message('{"type":"turn.cancel","turn_id":3}') == TurnCancel(3)
    assert parse_client_message('{"type":"session.update","format":"opus","sample_rate":48000}') == SessionUpdate(
        "opus", 48000, None
    )


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("{bad", "invalid_json"),
        ("[1,2]", "invalid_message"),
        ('{"type":"nope"}', "unknown_type"),
        ('{"text":"x"}', "missing_field"),
        ('{"type":"text.delta","text":"x"}', "missing_field"),
        ('{"type":"text.delta","turn_id":1}', "missing_field"),
        ('{"type":"text.delta","turn_id":1,"text":5}', "invalid_field"),
        ('{"type":"text.delta","turn_id":true,"text":"x"}', "invalid_field"),
        ('{"type":"text.delta","turn_id":[1],"text":"x"}', "invalid_field"),
        ('{"type":"session.update","format":"mp3"}', "invalid_field"),
        ('{"type":"session.update","sample_rate":16000}', "invalid_field"),
        (b"\x00\x01", "binary_not_supported"),
        ("x" * (MAX_MESSAGE_BYTES + 1), "message_too_large"),
        (json.dumps({"type": "text.delta", "turn_id": 1, "text": "a" * 9000}), "text_too_long"),
        ("[" * 60_000, "invalid_json"),
        ("[" * 30_000 + "]" * 30_000, "invalid_json"),  # well-formed, deeper than the parser's stack
        ('{"type":"text.delta","turn_id":' + "9" * 5_000 + ',"text":"x"}', "invalid_json"),  # > 4,300 digits
        ('{"type":"text.delta","turn_id":' + "9" * 4_000 + ',"text":"x"}', "invalid_field"),
        ('{"type":"text.end","turn_id":9007199254740992}', "invalid_field"),  # 2**53
        ('{"type":"session.update","sample_rate":' + "1" * 5_000 + "}", "invalid_json"),
    ],
)
def test_bad_input_has_a_stable_code(raw: str | bytes, code: str) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_client_message(raw)
    assert err.value.code == code
