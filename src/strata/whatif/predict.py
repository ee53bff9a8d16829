"""Predicted t/s of a model on a catalogue device: t = x/η + c per token.

x is the time a token takes at the device's datasheet roofline (explain's ceiling: decode
reads the weights and the KV cache once per token; prefill streams them once per pass and
is mostly compute-bound), η and c come from strata.whatif.provenance with their tier. The
result is fit's Prediction, so `fit --on` prints it like any fit prediction: η there is the
effective one (predicted ÷ ceiling), its basis says where η and c came from.
"""

from __future__ import annotations

from strata.bench.explain import explain
from strata.bench.scenario import BenchTest
from strata.fit.predict import Eta, Prediction, tests_for
from strata.hardware.catalogue import CatalogueDevice
from strata.models.spec import ModelSpec
from strata.whatif.device import roofline
from strata.whatif.provenance import Evidence, Speed


def _eta(speed: Speed, effective: float) -> Eta:
    n = len(speed.sources)
    return Eta(effective, effective * speed.low, effective * speed.high, n,
               f"{speed.basis}; x = time at the datasheet ceiling, t = x/η + c",
               speed.sources)


def predict_device(spec: ModelSpec, dev: CatalogueDevice, kv_type: str,
                   runtime_dtype: str | None, ctx: int, evidence: Evidence,
                   tests: list[BenchTest] | None = None) -> list[Prediction]:
    out = []
    roof = roofline(dev)
    for test in tests if tests is not None else tests_for(ctx):
        if test.kind == "pg":
            continue
        ex = explain(spec, test, roof, kv_type, runtime_dtype, achieved={})
        phase = "prefill" if test.kind == "pp" else "decode"
        ceiling = ex.prefill_ceiling_tps if phase == "prefill" else ex.decode_ceiling_tps
        if not ceiling:
            continue  # the datasheet lacks that figure: absent, never guessed
        if phase == "prefill" and not dev.tflops:
            continue  # no sourced FLOP/s figure: no prefill ceiling
        speed = evidence.speed(dev, phase, ex.compute_dtype if phase == "prefill" else None)
        tps = min(speed.tps(1.0 / ceiling), ceiling)
        high = min(tps * speed.high, ceiling)  # no range reaches past the roof
        out.append(Prediction(dev.id, test.name, phase, ceiling, _eta(speed, tps / ceiling),
                              tps, min(tps * speed.low, high), high))
    return out
