"""The training engine: LitTransformer (lightning_module.py), its optimizers and schedules, the callbacks that watch
a run (monitoring.py) and write its task's output (task_outputs.py), the run's safeguards one concern a file
(gradients, nonfinite_guard, preemption, step_seed, devices), glibc's malloc for training (host_allocator) and
Lightning's private API (lightning_compat.py)."""
