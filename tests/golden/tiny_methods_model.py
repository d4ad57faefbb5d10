"""tiny_state_model.py with two methods (SPEC §2c) sharing its weights and its counter: ``forward`` (the dynamic
batch, what a plain call runs) and ``one`` (a single row). The model of the 1.10 golden package; keep it unchanged."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("_golden_tiny_state", Path(__file__).with_name("tiny_state_model.py"))
state = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(state)

model = state.model
check_input = state.check_input
methods = {"forward": {"example_inputs": state.example_inputs, "dynamic_shapes": state.dynamic_shapes},
           "one": {"example_inputs": lambda: (state.example_inputs()[0][:1],)}}
