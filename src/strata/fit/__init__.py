"""`strata fit`: plan before you download — memory per device, verdicts, largest context,
fitting quantisations and predicted t/s, from a model's metadata alone.

Public API:
  FitOptions(ctx, batch, kv_type, backend)      validated request (InputError on bad input)
  fit_model(model, host, options, roofline, history, fingerprint) -> FitReport
  EtaHistory.from_db(conn, fingerprint, backend, cache_bytes)   past η of this host
  memory rules: strata.fit.memory (Shape, Memory, LLAMACPP_CPU, LLAMACPP_GPU, ...)
"""

from __future__ import annotations

from strata.fit.plan import FitOptions, FitReport, QuantWeights, fit_model
from strata.fit.predict import Eta, EtaHistory, EtaSource, Prediction
from strata.fit.verdict import FITS, NO, PARTIAL, UNKNOWN, DeviceFit

__all__ = ["FITS", "NO", "PARTIAL", "UNKNOWN", "DeviceFit", "Eta", "EtaHistory", "EtaSource",
           "FitOptions", "FitReport", "Prediction", "QuantWeights", "fit_model"]
