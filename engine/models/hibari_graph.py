"""The embedded voice's ONNX graph with its duration predictor's output exposed.

hibari's network predicts, for each phoneme id, how many 12.5 ms frames it lasts (the ``/dur``
convolution stack, then ``round(exp(x) - 1) / speed``, clipped to >= 1 and cast to int64), and
expands each phoneme's encoding over that many frames (``CumSum`` -> ``Range`` ->
``GreaterOrEqual`` -> ``ReduceSum`` -> ``Gather``). The graph only outputs the spectra and F0; the
integer frame counts (``DURATION_TENSOR``, one per id, the two 0 pads included, summing to the
output's frame count) are what the voice's word timings come from. The wheel's graph is used as
it is: this module adds that tensor to the graph's outputs, editing the ModelProto's protobuf
bytes directly (the ``onnx`` package is not a dependency), so the network and its numbers are
unchanged.

Protobuf field numbers (onnx.proto3): ModelProto.graph = 7; GraphProto.node = 1, .output = 12;
NodeProto.output = 2, .op_type = 4; ValueInfoProto.name = 1, .type = 2; TypeProto.tensor_type = 1;
TypeProto.Tensor.elem_type = 1, .shape = 2; TensorShapeProto.dim = 1; Dimension.dim_param = 2.
"""

from __future__ import annotations

DURATION_TENSOR = "/Cast_32_output_0"  # (L,) int64: frames per phoneme id
_INT64 = 7  # TensorProto.DataType.INT64


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _fields(buf: bytes) -> list[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of one message, in order: varints as int, the rest as bytes."""
    out: list[tuple[int, int, bytes | int]] = []
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        number, wire = key >> 3, key & 7
        value: bytes | int
        if wire == 0:
            value, i = _read_varint(buf, i)
        elif wire == 2:
            n, i = _read_varint(buf, i)
            value, i = buf[i : i + n], i + n
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.append((number, wire, value))
    return out


def _encode(fields: list[tuple[int, int, bytes | int]]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += _varint(number << 3 | wire)
        if wire == 0:
            assert isinstance(value, int)
            out += _varint(value)
        else:
            assert isinstance(value, bytes)
            if wire == 2:
                out += _varint(len(value))
            out += value
    return bytes(out)


def _message(*fields: tuple[int, bytes | int]) -> bytes:
    return _encode([(n, 0 if isinstance(v, int) else 2, v) for n, v in fields])


def _produces(node: bytes, tensor: bytes) -> bool:
    return any(n == 2 and v == tensor for n, _, v in _fields(node))


def with_durations(model: bytes) -> bytes:
    """``model`` (a serialized hibari ONNX model) with ``DURATION_TENSOR`` as one more output.
    Raises ValueError for a graph without that tensor (another export of the network)."""
    top = _fields(model)
    try:
        g = next(i for i, (n, w, _) in enumerate(top) if n == 7 and w == 2)
    except StopIteration:
        raise ValueError("not an ONNX model: no graph") from None
    graph = top[g][2]
    assert isinstance(graph, bytes)
    name = DURATION_TENSOR.encode()
    graph_fields = _fields(graph)
    if not any(n == 1 and isinstance(v, bytes) and _produces(v, name) for n, _, v in graph_fields):
        raise ValueError(f"this hibari graph has no {DURATION_TENSOR} (duration predictor output)")
    if any(n == 12 and isinstance(v, bytes) and _fields(v)[0][2] == name for n, _, v in graph_fields):
        return model
    shape = _message((1, _message((2, b"L"))))
    output = _message((1, name), (2, _message((1, _message((1, _INT64), (2, shape))))))
    top[g] = (7, 2, graph + _encode([(12, 2, output)]))
    return _encode(top)
