"""`strata whatif`: models on devices this host is not (the device catalogue)."""

from __future__ import annotations

from typing import Annotated

import typer

from strata.api import WHATIF_COLUMNS
from strata.cli import DbOption, app, err, out
from strata.cli.helptext import reflowed
from strata.cli.output import FormatOption, JsonOption, output_format, read_store
from strata.errors import InputError
from strata.views.output import emit

OnOption = Annotated[list[str] | None, typer.Option(
    "--on", metavar="DEVICE", help="A catalogue device (id, name or alias; repeatable); "
    "DEVICE:GiB for another memory size. Default: every device.", show_default=False)]
RamOption = Annotated[float | None, typer.Option(
    "--ram", metavar="GiB", help="Host RAM beside a discrete GPU.",
    show_default=False, rich_help_panel="Plan")]


@app.command()
@reflowed
def whatif(
    models: Annotated[list[str] | None, typer.Argument(
        metavar="MODEL", help="Models (several allowed) as fit takes them: file.gguf, a "
        "Hugging Face dir, synthetic:<preset>@<quant>. Only metadata is read.",
        show_default=False)] = None,
    on: OnOption = None,
    ctx: Annotated[int | None, typer.Option("--ctx", "-c", help="Context per sequence "
                                            "(default 4096).", show_default=False)] = None,
    kv_type: Annotated[str | None, typer.Option("--kv-type", help="KV cache type: f16 "
                                                "(default), q8_0 or q4_0.",
                                                show_default=False)] = None,
    price: Annotated[list[str] | None, typer.Option(
        "--price", metavar="DEVICE=USD", help="What a device costs you (repeatable): adds "
        "t/s per $1000. Prices are never shipped.", show_default=False)] = None,
    prices: Annotated[str | None, typer.Option(
        "--prices", metavar="FILE", help="Prices from a file: JSON {device: USD} or "
        "lines device=USD.", show_default=False)] = None,
    ram: RamOption = None,
    flash_attn: Annotated[int, typer.Option(
        "-fa", "--flash-attn", metavar="0|1[,...]", help="Plan with flash attention "
        "(llama.cpp's -fa auto: on, 1) or without (0).", show_default=False,
        rich_help_panel="Plan")] = 1,
    sweep: Annotated[str | None, typer.Option(
        "--sweep", metavar="WHAT", help="memory: vary the --on device's memory size and "
        "bandwidth (channels on a CPU platform).", show_default=False)] = None,
    list_devices: Annotated[bool, typer.Option(
        "--list", help="List the catalogue (-o json: with sources).",
        rich_help_panel="Catalogue")] = False,
    validate: Annotated[bool, typer.Option(
        "--validate", help="Predict the held-out published measurements; print the error "
        "per device class.", rich_help_panel="Catalogue")] = False,
    fmt: FormatOption = None,
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """What if I bought DEVICE: would MODEL fit, would my software drive it, how fast?

    Per model and catalogue device: fit's verdict (weights, KV and buffers at --ctx; the
    largest context), the support verdict of the PyTorch wheels and llama.cpp backends that
    drive it (and the ones that cannot), predicted decode and prefill t/s with a range, and
    t/s per $1000 (--price) and per watt (the catalogue's TDP).

    Prediction: t = x/η + c per token, x = seconds at the device's datasheet roofline (the
    bytes and FLOPs per token that explain every bench result). η and the fixed per-token
    cost c come from, in order: this DB's bench results on the same device, or on its
    architecture; published measurements of its device class (fitted, shipped with the
    catalogue); a prior. The basis column says which. MoE models read only the active
    experts per token. Figures are datasheet values, each with its source (--list -o json).

    [bold]Examples[/bold]
      strata whatif synthetic:llama-3.1-8b@q4_k_m --on rtx-4090 --on rx-9070-xt
      strata whatif model.gguf --on "m4 max" --price m4-max-40c=3499
      strata whatif synthetic:llama-3.1-70b@q4_k_m --on epyc-9654 --sweep memory
      strata whatif --list
    """
    fmt = output_format(fmt, json_out)
    from strata.hardware.catalogue import load_catalogue
    from strata.views import whatif as view

    if list_devices:
        from strata.whatif.plan import parse_on

        devices = [parse_on(x) for x in on] if on else list(load_catalogue())
        emit(out, fmt, [d.to_dict() for d in devices], document=[d.to_dict() for d in devices],
             table=lambda: out.print(view.catalogue_table(devices)))
        return
    if validate:
        _validate(fmt)
        return
    if not models:
        raise InputError("whatif needs MODEL… (or --list, --validate); e.g. strata whatif "
                         "synthetic:llama-3.1-8b@q4_k_m --on rtx-4090")
    conn = read_store(db)
    from strata.commands.whatif import run_whatif
    from strata.whatif.plan import parse_prices, read_price_file

    if flash_attn not in (0, 1):
        raise InputError(f"-fa {flash_attn}: flash attention is 0 (off) or 1 (on)")
    paid = {**(read_price_file(prices) if prices else {}), **parse_prices(price or [])}
    answer = run_whatif(conn, models, on or [], ctx=ctx, kv_type=kv_type, prices=paid,
                        ram_gib=ram, sweep_what=sweep, flash_attn=bool(flash_attn))
    if answer.sweeps and fmt not in ("table", "json"):
        err.print(f"the sweep is in -o json and the table; -o {fmt} holds the rows only",
                  markup=False, highlight=False)

    def table() -> None:
        out.print(view.whatif_table(answer))  # narrowed on a narrow terminal
        absent = [a for r in answer.rows for a in r.absent] if len(answer.rows) <= 12 else []
        for line in [*absent, *view.support_lines(answer), *answer.notes]:
            out.print(line, highlight=False)
        for dev, variants in answer.sweeps.items():
            out.print(view.sweep_table(dev, variants))

    records = answer.records()
    if fmt == "md":  # a table to paste: figures to 3 significant digits (json keeps all)
        records = [{k: _sig(v) for k, v in r.items()} for r in records]
    emit(out, fmt, records, document=answer.to_json(), table=table, md_columns=WHATIF_COLUMNS)


def _sig(value: object) -> object:
    if isinstance(value, float):
        return float(f"{value:.3g}") if abs(value) < 1000 else round(value)
    return value


def _validate(fmt: str) -> None:
    from dataclasses import asdict

    from strata.views import whatif as view
    from strata.whatif.validate import check, summarise

    checked = check()
    summary = summarise(checked)
    records = [asdict(s) for s in summary]
    emit(out, fmt, records, document={"summary": records, "rows": [
        {"device": c.row.device.id, "model": c.row.model, "quant": c.row.quant,
         "test": c.row.test, "measured_ts": c.row.tps, "predicted_ts": c.predicted_tps,
         "error": c.error, "tier": c.tier, "source": c.row.source} for c in checked]},
        table=lambda: out.print(view.validation_table(summary)))
