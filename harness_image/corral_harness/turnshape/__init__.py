"""The shape of a turn (docs/turns.md): phases as data, the scheduler's route choice, forced
plans and their machine checks. `phases`, `scheduler`, `plan` and `checks` are pure; `shaper`
runs the non-reactive routes through the engine seam for the turn."""
