"""Forward-only schema migrations. Append a new entry; never edit a released one.

Each entry is (version, statements). `migrate` applies every entry above the stored
version inside one transaction per step, so an interrupted upgrade leaves the DB at the
last complete version.
"""

from __future__ import annotations

MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
        """CREATE TABLE hosts (
            fingerprint TEXT PRIMARY KEY,
            hostname    TEXT NOT NULL,
            summary     TEXT NOT NULL,           -- one line: CPU / GPUs, for listings
            first_seen  TEXT NOT NULL,
            last_seen   TEXT NOT NULL,
            profile     TEXT NOT NULL            -- HostProfile as JSON (latest probe)
        )""",
        """CREATE TABLE measurements (
            id            INTEGER PRIMARY KEY AUTOINCREMENT,
            fingerprint   TEXT NOT NULL REFERENCES hosts(fingerprint),
            kind          TEXT NOT NULL,         -- 'roofline', 'telemetry', ...
            created_at    TEXT NOT NULL,
            strata        TEXT NOT NULL,         -- strata version
            git_commit    TEXT,
            data          TEXT NOT NULL          -- JSON payload, self-describing
        )""",
        "CREATE INDEX measurements_host_kind ON measurements(fingerprint, kind, created_at)",
    ]),
    (2, [
        """CREATE TABLE runs (
            id           INTEGER PRIMARY KEY AUTOINCREMENT,
            fingerprint  TEXT NOT NULL REFERENCES hosts(fingerprint),
            command      TEXT NOT NULL,          -- 'bench', ...
            argv         TEXT NOT NULL,          -- JSON list, as typed
            config       TEXT NOT NULL,          -- JSON: full sweep configuration
            status       TEXT NOT NULL,          -- running | complete | incomplete | failed
            started_at   TEXT NOT NULL,
            finished_at  TEXT,
            strata       TEXT NOT NULL,
            git_commit   TEXT
        )""",
        """CREATE TABLE results (
            id           INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id       INTEGER NOT NULL REFERENCES runs(id),
            model        TEXT NOT NULL,
            backend      TEXT NOT NULL,
            test         TEXT NOT NULL,          -- pp512, tg128, pp512+tg128 @ d1024
            n_prompt     INTEGER NOT NULL,
            n_gen        INTEGER NOT NULL,
            n_depth      INTEGER NOT NULL,
            load_config  TEXT NOT NULL,          -- JSON LoadConfig
            metrics      TEXT NOT NULL,          -- JSON: metric -> Summary (mean, sd, n, ...)
            explain      TEXT,                   -- JSON Explanation (absent for endpoints)
            telemetry    TEXT,                   -- JSON telemetry summary + verdict
            info         TEXT NOT NULL,          -- JSON: backend versions, model spec summary
            created_at   TEXT NOT NULL
        )""",
        """CREATE TABLE samples (
            result_id    INTEGER NOT NULL REFERENCES results(id),
            metric       TEXT NOT NULL,
            idx          INTEGER NOT NULL,
            value        REAL NOT NULL,
            PRIMARY KEY (result_id, metric, idx)
        )""",
        "CREATE INDEX results_run ON results(run_id)",
    ]),
]

MIGRATIONS.append(
    (3, [
        """CREATE TABLE kernel_impls (          -- external kernels (`strata kernels add`)
            key          TEXT PRIMARY KEY,       -- op/name
            op           TEXT NOT NULL,
            name         TEXT NOT NULL,
            dialect      TEXT NOT NULL,
            path         TEXT NOT NULL,          -- private copy under the cache dir
            origin_path  TEXT NOT NULL,          -- the file the user added
            content_hash TEXT NOT NULL,
            added_at     TEXT NOT NULL
        )""",
        """CREATE TABLE kernel_results (
            id           INTEGER PRIMARY KEY AUTOINCREMENT,
            fingerprint  TEXT NOT NULL REFERENCES hosts(fingerprint),
            op           TEXT NOT NULL,
            impl         TEXT NOT NULL,          -- "c.avx2", "torch.eager", ...
            impl_hash    TEXT NOT NULL,          -- source + declaration + harness version
            kind         TEXT NOT NULL,          -- verify | bench
            status       TEXT NOT NULL,          -- pass | fail | compiled | ok | error
            device       TEXT NOT NULL,
            dtype        TEXT NOT NULL,
            shape        TEXT,                   -- JSON dims (bench rows)
            data         TEXT NOT NULL,          -- JSON: figures or the failure
            created_at   TEXT NOT NULL,
            strata       TEXT NOT NULL,
            git_commit   TEXT
        )""",
        "CREATE INDEX kernel_results_lookup ON kernel_results(fingerprint, op, impl, kind)",
    ]),
)

MIGRATIONS.append(
    (4, [
        """CREATE TABLE kernel_attempts (       -- one model reply (`strata kernels generate`)
            id             INTEGER PRIMARY KEY AUTOINCREMENT,
            run            TEXT NOT NULL,        -- the generate/eval invocation
            fingerprint    TEXT NOT NULL,        -- the host that judged it (no FK: imports)
            op             TEXT NOT NULL,
            dialect        TEXT NOT NULL,
            device         TEXT NOT NULL,
            endpoint       TEXT NOT NULL,
            model          TEXT NOT NULL,
            template_hash  TEXT NOT NULL,
            skill          TEXT,                 -- name@hash, or NULL
            sample         INTEGER NOT NULL,
            turn           INTEGER NOT NULL,
            prompt         TEXT NOT NULL,        -- the messages sent, JSON
            reply          TEXT NOT NULL,        -- raw reply text
            code           TEXT,                 -- extracted source (NULL: format failure)
            code_hash      TEXT,
            status         TEXT NOT NULL,        -- format | static | ... | slow | ok
            reason         TEXT NOT NULL,
            feedback       TEXT NOT NULL,
            cheat          INTEGER NOT NULL,
            registered     INTEGER NOT NULL,
            tokens_in      INTEGER,
            tokens_out     INTEGER,
            latency_s      REAL,
            speedup_eager  REAL,                 -- Timing, one column per field
            speedup_best   REAL,
            roofline_share REAL,
            seconds        REAL,
            created_at     TEXT NOT NULL
        )""",
        "CREATE INDEX kernel_attempts_op ON kernel_attempts(op, created_at)",
        "CREATE INDEX kernel_attempts_model ON kernel_attempts(model, op)",
        "CREATE INDEX kernel_attempts_run ON kernel_attempts(run, sample, turn)",
    ]),
)

MIGRATIONS.append(
    (5, [
        """CREATE TABLE train_runs (            -- `strata train`: one row per run (runs.id)
            run_id        INTEGER PRIMARY KEY REFERENCES runs(id),
            preset        TEXT NOT NULL,
            model         TEXT NOT NULL,        -- JSON ModelConfig
            params        INTEGER NOT NULL,
            data          TEXT NOT NULL,        -- JSON: sources, split hashes, token counts
            device        TEXT NOT NULL,
            dtype         TEXT NOT NULL,
            kernels       TEXT NOT NULL,        -- lab | torch
            ops           TEXT NOT NULL,        -- JSON: op -> {impl, decision}
            world_size    INTEGER NOT NULL,     -- data-parallel processes
            steps         INTEGER NOT NULL,     -- optimizer steps asked for
            step          INTEGER NOT NULL,     -- optimizer steps done
            tokens_seen   INTEGER NOT NULL,
            tokens_per_s  REAL,
            mfu           REAL,                 -- model FLOP/s / peak_gflops
            peak_gflops   REAL,                 -- the measured matmul peak MFU is against
            peak_basis    TEXT,
            val_loss      REAL,
            bits_per_byte REAL,
            out_dir       TEXT NOT NULL,
            outputs       TEXT NOT NULL,        -- JSON: checkpoint, hf, gguf, tokenizer paths
            sample        TEXT,
            resumed_from  INTEGER REFERENCES runs(id),
            updated_at    TEXT NOT NULL
        )""",
        """CREATE TABLE train_points (          -- the loss curves
            run_id        INTEGER NOT NULL REFERENCES runs(id),
            kind          TEXT NOT NULL,        -- train | val
            step          INTEGER NOT NULL,
            loss          REAL NOT NULL,
            lr            REAL,
            bits_per_byte REAL,
            tokens_per_s  REAL,
            mfu           REAL,
            elapsed_s     REAL,
            PRIMARY KEY (run_id, kind, step)
        )""",
    ]),
)

MIGRATIONS.append(
    (6, [
        """CREATE TABLE kernel_trust (           -- `strata kernels trust`: run in-process
            key          TEXT PRIMARY KEY,       -- op/name of an added (external) kernel
            op           TEXT NOT NULL,
            name         TEXT NOT NULL,
            source_hash  TEXT NOT NULL,          -- sha256 of the source bytes trusted
            trusted_at   TEXT NOT NULL,
            note         TEXT NOT NULL DEFAULT ''
        )""",
    ]),
)
