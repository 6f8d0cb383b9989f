"""The GRPO stage kind: reinforcement on the rewards with Tunix's GRPOLearner (and its DAPO and
Dr. GRPO variants).

training.py holds the stage (the learner session, the step loop, the entry point `run`);
rollouts.py the per-step sampling seeds, metrics.py what a step reports, timing.py where a
step's time goes. Importers name the module they use; this package re-exports nothing.
"""
