"""Quantization schemes: the knobs in which real integer backends differ, and named presets.

Each field names one choice a backend makes; ``docs/backend.md`` names, per preset, the public source
files (onnxruntime's MLAS, TFLite/gemmlowp, Glow) whose arithmetic the values follow.
The kernels never test a preset's name: they read the fields, so a user can build any mix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from pytest_qaccuracy.errors import InputError
from pytest_qaccuracy.plain import Plain
from pytest_qaccuracy.presets import HOST, NAMES, split_release

Multiplier = Literal["float32", "float64", "q31", "q15", "power2", "glow"]
Rounding = Literal["half_even", "half_up", "half_away", "floor"]
Accumulator = Literal["exact", "wrap32", "saturate32"]
ScalePrecision = Literal["float32", "float64", "float32_product"]
FloatKernels = Literal["mlas", "numpy", "reference"]
QLinearBinary = Literal["multiplier", "mlas_neon"]

#: Op families whose requantization may add the zero point before or after rounding.
FAMILIES = ("gemm", "add", "mul", "pool", "global_pool", "quantize")


@dataclass(frozen=True, slots=True)
class Scheme(Plain):
    """How an integer backend turns an int32 accumulator into an 8-bit output.

    Attributes:
        name: preset name, or a user label.
        multiplier: how the real multiplier ``M = s_in * s_w / s_out`` is represented:
            ``float32`` (acc and M in float32, one float multiply), ``float64``, ``q31`` (int32
            multiplier + shift, TFLite ``QuantizeMultiplier``), ``q15`` (16-bit multiplier + shift),
            ``power2`` (a shift only: M rounded to the nearest power of two) or ``glow`` (Glow CPU's
            pre-shift, ~8-bit integer scale and post-shift).
        rounding: rounding of the final step: ``half_even``, ``half_up`` (toward +inf),
            ``half_away`` (from zero) or ``floor``.
        double_rounding: fixed point only: gemmlowp's SaturatingRoundingDoublingHighMul (half up)
            followed by RoundingDivideByPOT (half away), instead of one rounding shift.
        zp_before_rounding: op families (see ``FAMILIES``) that add the output zero point before
            rounding; the others add it after.
        accumulator: ``wrap32`` (int32 with two's complement wrap, as C kernels), ``exact`` (never
            wraps: an int64 accumulator) or ``saturate32`` (the final sum saturates to int32).
        pair_saturation: u8 x s8 products are summed in neighbouring pairs of the reduction axis with
            int16 saturation before they reach the accumulator, as onnxruntime's x86 kernels on CPUs
            without VNNI (``vpmaddubsw``; see ``pairs.py``). Convolutions, MatMul, Gemm and
            MatMulInteger; depthwise convolutions (one input and one output channel per group) and
            ConvInteger sum exactly, as onnxruntime does on those CPUs.
        qdq_int8_to_uint8: int8 QDQ activations run as uint8 (value and zero point + 128) before QDQ
            groups are fused, as onnxruntime's default session does on x86 (its ``QDQS8ToU8``
            transformer; ``session.qdqisint8allowed=1`` turns it off). Weights stay int8.
        scale_precision: how ``s_in * s_w / s_out`` is computed from the float32 scales:
            ``float32`` (both steps in float32, ORT), ``float64`` (TFLite), ``float32_product``
            (product in float32, division in float64, TVM's ONNX import).
        quantize_rounding: rounding of QuantizeLinear and of the lookup tables of elementwise ops.
        weight_bits: bits the target stores weights in; weights outside that range saturate.
        reduce_range: weights saturate to ``weight_bits - 1`` bits (ORT ``reduce_range``).
        fuse_qdq: run ``DQ -> op -> Q`` groups as integer kernels (ORT); ``False`` runs them in float
            as written (onnx.reference).
        quantize_float_weights: a Conv, ConvTranspose or Gemm left in float between a DequantizeLinear and a
            QuantizeLinear gets int8 weights and an int32 bias, as onnxruntime 1.21 and later do at load
            time (``weight_quantization.py``). The onnxruntime presets follow the installed onnxruntime.
        float_kernels: float maths: ``mlas`` (numpy kernels; logistic by MLAS's rational polynomial
            with FMA, for the Sigmoid tables), ``numpy`` (numpy kernels, exact ``exp``) or
            ``reference`` (every float op through ``onnx.reference``).
        neon_pair_wrap: int8 products summed in pairs ``(k, k + 8)`` of each 16-deep block of the
            reduction axis with int16 wrap-around, as onnxruntime's ARM64 kernels on CPUs without the
            dot-product instructions (``smull`` + ``smlal``; uint8 activations flipped to int8 first; see
            ``neon_pairs.py``): GEMMs with int8 weights and uint8 x int8 convolutions other than depthwise.
        qdq_pairs_removed_first: with ``qdq_int8_to_uint8``, an int8 pair is judged once Identity nodes and
            redundant ``DQ -> Q`` pairs after it are removed (onnxruntime 1.19 and later: a pair whose
            chain ends in a graph output stays int8); False: as it stands (1.18, measured on the corpus's
            digits MLP, whose Softmax group 1.18 fuses). The onnxruntime presets follow the installed
            onnxruntime.
        neon_int8_conv_pairs: with ``neon_pair_wrap``, int8 x int8 convolutions (other than depthwise) pair
            and wrap the same way, as onnxruntime 1.29 and earlier on CPUs without dot products (their GEMM
            kernel; 1.30 and later sum them exactly in a symmetric convolution kernel). The onnxruntime
            presets follow the installed onnxruntime.
        depthwise_pair_wrap: depthwise convolutions with int8 weights (zero point 0) add the int8 products
            of two kernel taps in int16 with wrap-around, as MLAS's ARM64 depthwise kernels on every ARM64
            CPU (taps ``(0, 2), (1, 3), (4, 6), (5, 7)`` of 9-tap kernels on channels in blocks of 16,
            neighbouring taps otherwise; ``neon_pairs.depthwise_correction``).
        qlinear_binary: QLinearAdd and QLinearMul: ``multiplier`` (as the ``multiplier`` field says; MLAS's
            x86 float kernels for ``float32``) or ``mlas_neon`` (MLAS's ARM64 kernels: the add with two
            integer multipliers and a rounding shift half away from zero, the mul's rescale and zero point
            in one fused multiply-add; ``kernels/neon.py``).
        softmax_int8_wraps: int8 QLinearSoftmax clips ``q + zp`` to at most 255, as the uint8 kernel, and
            keeps the low byte (128 becomes -128: a confident row of a softmax quantized to ``1/256, -128``),
            as onnxruntime 1.28 and earlier (github.com/microsoft/onnxruntime/issues/29727); the onnxruntime
            presets follow the installed onnxruntime.
        saturating_conversion: a float converted to an integer saturates (ARM64's ``fcvtzs``/``fcvtzu``:
            infinity becomes INT32_MAX or UINT32_MAX) where x86 gives its "integer indefinite" value;
            it shows where onnxruntime 1.31 and earlier's QLinearSoftmax overflows float32
            (``kernels/softmax.py``).
        pool_size_plain: a pool's output sizes are the ONNX formulas as written, ``int(span / stride + 1)``
            in float (no output where the window overruns the input by less than a stride) and with
            ``ceil_mode`` ``ceil(span / stride) + 1``, a last window that starts in the end padding kept,
            as onnxruntime 1.20 and earlier; False: ``int(span / stride) + 1`` and such a window dropped,
            as onnxruntime 1.21 and later (``span`` = padded size - dilated kernel, ``SAME_*`` pads too:
            a dilated window that overruns them differs). The onnxruntime presets follow the installed
            onnxruntime.
        softmax_float64: QLinearSoftmax divides ``t * floor(1 / y_scale)`` by the row sum in float64 and
            rounds in float64, as onnxruntime 1.32 does; False: in float32, as onnxruntime 1.31 and earlier
            (``kernels/softmax.py``). The onnxruntime presets follow the installed onnxruntime.
    """

    name: str = "custom"
    multiplier: Multiplier = "float32"
    rounding: Rounding = "half_even"
    double_rounding: bool = False
    zp_before_rounding: frozenset[str] = frozenset()
    accumulator: Accumulator = "wrap32"
    pair_saturation: bool = False
    qdq_int8_to_uint8: bool = False
    qdq_pairs_removed_first: bool = True
    scale_precision: ScalePrecision = "float32"
    quantize_rounding: Rounding = "half_even"
    weight_bits: int = 8
    reduce_range: bool = False
    fuse_qdq: bool = True
    quantize_float_weights: bool = False
    float_kernels: FloatKernels = "numpy"
    neon_pair_wrap: bool = False
    neon_int8_conv_pairs: bool = False
    depthwise_pair_wrap: bool = False
    qlinear_binary: QLinearBinary = "multiplier"
    softmax_float64: bool = False
    pool_size_plain: bool = False
    saturating_conversion: bool = False
    softmax_int8_wraps: bool = False

    def __post_init__(self) -> None:
        if self.accumulator not in ("exact", "wrap32", "saturate32"):
            hint = " (the int16 pair sums of x86 CPUs without VNNI are pair_saturation=True)"
            raise InputError(
                f"scheme '{self.name}': accumulator must be exact, wrap32 or saturate32, got {self.accumulator!r}"
                + (hint if self.accumulator == "int16_pairs" else "")
            )
        unknown = set(self.zp_before_rounding) - set(FAMILIES)
        if unknown:
            raise InputError(f"scheme '{self.name}': unknown op families {sorted(unknown)}; known: {FAMILIES}")
        if not 2 <= self.weight_bits - int(self.reduce_range) <= 8:
            raise InputError(f"scheme '{self.name}': weight_bits must leave 2..8 bits, got {self.weight_bits}")
        if self.double_rounding and self.multiplier != "q31":
            raise InputError(f"scheme '{self.name}': double_rounding needs multiplier='q31'")

    def zp_first(self, family: str) -> bool:
        """True when ``family`` adds the output zero point before rounding."""
        return family in self.zp_before_rounding

    def replace(self, **changes: object) -> Scheme:
        """A copy with some fields changed (``name`` becomes ``custom`` unless given)."""
        changes.setdefault("name", "custom")
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def _onnxruntime_version() -> tuple[int, int]:
    """``(major, minor)`` of the installed onnxruntime, read from its metadata (no import)."""
    from importlib import metadata

    for dist in ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml"):
        try:
            major, minor = metadata.version(dist).split(".")[:2]
            return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)
        except (metadata.PackageNotFoundError, ValueError):
            continue
    return (0, 0)


def _quantizes_float_weights(version: tuple[int, int]) -> bool:
    """Whether that onnxruntime gives float weights between Q/DQ int8 weights at load time: 1.21 and
    later, except 1.22 (measured on 1.20.1 through 1.26.0 and on 1.32.0: 1.22.0 and 1.22.1 leave them
    in float)."""
    return version >= (1, 21) and version != (1, 22)


def _softmax_in_float64(version: tuple[int, int]) -> bool:
    """Whether that onnxruntime's QLinearSoftmax divides in float64: 1.32 and later (its kernel takes
    the inverse output scale as a double; 1.18 through 1.31 take a float, read from their binaries and
    measured on 1.18.0, 1.31.0 and 1.32.0)."""
    return version >= (1, 32)


def _pairs_int8_convolutions(version: tuple[int, int]) -> bool:
    """Whether that onnxruntime's int8 x int8 convolutions on ARM64 CPUs without dot products go through
    the GEMM kernel that pairs products in int16: 1.29 and earlier (measured with the aarch64 wheels of
    1.18.0, 1.19.2, 1.20.1 through 1.29.0 on an emulated Cortex-A53; 1.30.0, 1.31.1 and 1.32.0 sum
    exactly)."""
    return version < (1, 30)


def _pool_size_plain(version: tuple[int, int]) -> bool:
    """Whether that onnxruntime sizes pools by the plain ONNX formulas: 1.20 and earlier (measured on the
    x86 wheels of 1.18.0, 1.19.2, 1.20.1 against 1.21.1 through 1.32.0: MaxPool, AveragePool and
    QLinearAveragePool)."""
    return version < (1, 21)


def _softmax_int8_wraps(version: tuple[int, int]) -> bool:
    """Whether that onnxruntime's int8 QLinearSoftmax wraps instead of clipping: 1.28 and earlier
    (measured on the x86 wheels of 1.18.0 through 1.28.0 and the aarch64 ones of 1.18.0 and 1.28.0;
    1.29.0 and later clip)."""
    return version < (1, 29)


def _removes_pairs_first(version: tuple[int, int]) -> bool:
    """Whether that onnxruntime removes redundant QDQ pairs before converting int8 ones to uint8: 1.19
    and later (measured with the x86 wheels of 1.18.0 and 1.19.2 through 1.32.0 on the corpus)."""
    return version >= (1, 19)


def for_onnxruntime(scheme: Scheme, version: tuple[int, int]) -> Scheme:
    """An onnxruntime preset as that onnxruntime release computes: the fields that changed between
    releases set for ``version`` (``(major, minor)``), the name kept."""
    return scheme.replace(
        name=scheme.name,
        quantize_float_weights=_quantizes_float_weights(version),
        softmax_float64=_softmax_in_float64(version),
        neon_int8_conv_pairs=scheme.neon_pair_wrap and _pairs_int8_convolutions(version),
        pool_size_plain=_pool_size_plain(version),
        softmax_int8_wraps=_softmax_int8_wraps(version),
        qdq_pairs_removed_first=_removes_pairs_first(version),
    )


#: the installed onnxruntime, whose version decides the fields that changed between its releases
_INSTALLED = _onnxruntime_version()

#: onnxruntime's CPU arithmetic on x86 (MLAS) with a default session:
#: rne(f32(f32(acc) * f32(f32(xs*ws)/ys))) + zp; QLinearAdd/Mul/AveragePool add zp first.
_ONNXRUNTIME = Scheme(
    name="onnxruntime-vnni",
    multiplier="float32",
    zp_before_rounding=frozenset({"add", "mul", "pool"}),
    float_kernels="mlas",
    qdq_int8_to_uint8=True,
)

#: onnxruntime's CPU arithmetic on ARM64 (MLAS NEON) with a default session: int8 QDQ activations stay
#: int8 (QDQIsInt8Allowed() is true on ARM), exact int32 sums with the dot-product (sdot/udot) and i8mm
#: (smmla/ummla) kernels, QLinearAdd in fixed point and QLinearMul with an FMA (kernels/neon.py), depthwise
#: taps paired in int16.
_ARM64 = _ONNXRUNTIME.replace(
    name="onnxruntime-arm64",
    qdq_int8_to_uint8=False,
    qlinear_binary="mlas_neon",
    depthwise_pair_wrap=True,
    saturating_conversion=True,
)

#: every preset but the host's (``onnxruntime``, resolved by the host probe), by the names of
#: :data:`pytest_qaccuracy.presets.NAMES` (a test checks that they match)
PRESETS: dict[str, Scheme] = {
    # x86 with AVX2 or AVX512 but no VNNI: u8 x s8 pairs saturate to int16 (vpmaddubsw).
    "onnxruntime-avx2": _ONNXRUNTIME.replace(name="onnxruntime-avx2", pair_saturation=True),
    # x86 with AVX-VNNI, AVX512-VNNI or AMX: exact int32 sums.
    "onnxruntime-vnni": _ONNXRUNTIME,
    # ARM64 with the dot-product instructions (ARMv8.2+: Cortex-A55/A76 on, Neoverse, Apple, Graviton 2+).
    "onnxruntime-arm64": _ARM64,
    # ARM64 without them (ARMv8.0/8.1: Cortex-A53/A57/A72/A73, Raspberry Pi 3 and 4, Graviton 1): int16 pairs wrap.
    "onnxruntime-arm64-neon": _ARM64.replace(name="onnxruntime-arm64-neon", neon_pair_wrap=True),
    # onnx.reference: QLinearConv/MatMul in float64 with zp added before np.rint; QDQ groups unfused.
    "onnx-reference": Scheme(
        name="onnx-reference",
        multiplier="float64",
        zp_before_rounding=frozenset({"gemm"}),
        fuse_qdq=False,
        float_kernels="reference",
        pool_size_plain=True,
    ),
    # TFLite default build: Q31 multiplier, SRDHM then RoundingDivideByPOT; QUANTIZE rounds half away.
    "tflite": Scheme(
        name="tflite",
        multiplier="q31",
        rounding="half_away",
        double_rounding=True,
        scale_precision="float64",
        quantize_rounding="half_away",
    ),
    # TFLITE_SINGLE_ROUNDING=1: (acc*q + 2^(t-1)) >> t.
    "tflite-single-rounding": Scheme(
        name="tflite-single-rounding",
        multiplier="q31",
        rounding="half_up",
        scale_precision="float64",
        quantize_rounding="half_away",
    ),
    # TVM QNN requantize, rounding="UPWARD", int64 lowering; scales multiplied in float32 by Relay.
    "tvm-upward": Scheme(
        name="tvm-upward",
        multiplier="q31",
        rounding="half_up",
        scale_precision="float32_product",
    ),
    # A shift-only accelerator: M rounded to a power of two, rounding shift half up.
    "power2": Scheme(name="power2", multiplier="power2", rounding="half_up", scale_precision="float64"),
    # Glow CPU backend: integer pre/post shifts with a ~8-bit scale; offset after the shift.
    "glow": Scheme(name="glow", multiplier="glow", rounding="half_up"),
}
# the onnxruntime presets as the installed onnxruntime computes
PRESETS.update(
    {name: for_onnxruntime(scheme, _INSTALLED) for name, scheme in PRESETS.items() if name.startswith("onnxruntime")}
)


def get_scheme(scheme: str | Scheme | None) -> Scheme:
    """A preset by name (or the scheme itself; ``None`` means the default, ``onnxruntime``).

    ``onnxruntime`` is the preset of this machine's onnxruntime, ``onnxruntime-avx2`` or
    ``onnxruntime-vnni``, found once per process by a probe (see ``host.py``); the scheme returned
    carries the resolved name. An onnxruntime preset pinned to a release, ``onnxruntime-arm64-neon@1.28``
    (``presets.py``), computes as that release does (:func:`for_onnxruntime`) and keeps the pin in its
    name.

    Raises:
        InputError: the name is not a preset; the message lists the presets.
    """
    if isinstance(scheme, Scheme):
        return scheme
    try:
        preset, release = split_release(scheme) if scheme is not None else (None, None)
    except ValueError as exc:
        raise InputError(f"scheme {exc}") from None
    if release is not None:
        base = get_scheme(preset)
        return for_onnxruntime(base, release).replace(name=f"{base.name}@{release[0]}.{release[1]}")
    if scheme is None or scheme == HOST:
        from pytest_qaccuracy.backend.host import host_preset  # onnxruntime is imported only when asked

        return PRESETS[host_preset()]
    try:
        return PRESETS[scheme]
    except KeyError:
        raise InputError(f"unknown scheme '{scheme}'; presets: {', '.join(NAMES)}") from None
