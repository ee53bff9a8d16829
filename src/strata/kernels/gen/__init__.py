"""Language models write kernels: the prompt, the chat client, the turn loop that runs each
reply through the lab's judge (static check, sandboxed verification, benchmark), the
attempts store, and the metrics that rank models as kernel writers.

Module map (one job each): records (what is stored), chat (OpenAI-compatible client),
prompt (+ templates/), extract (code from a reply), feedback (status class + next-turn text),
judge (one candidate through the lab), loop (turns and samples), metrics (pass@k, fast_p,
bootstrap), evaluate (the leaderboard, replay). Skills live in strata.kernels.skills.
"""
