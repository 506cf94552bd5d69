"""Masked PPO on DungeonCrawl-v1, the grid game where most of the 15 actions are illegal.

Evaluation samples from the policy (``eval_policy="sample"``): at the CPU budget the greedy
policy of a configuration whose sampled play beats random play still loops and loses health
(bench/RESULTS.md, issue 11), so a greedy evaluation would rank configurations by how badly
their argmax stalls rather than by how well they play. 32 episodes per evaluation and 8 fresh
seeds for the re-training keep that noisier score's confidence intervals narrow. Returns start
below zero (health lost), so tuned vs default is also stated above random masked play's return
(``reference``; tests/test_grid_envs.py checks it).
"""

from harness import Budget, Study, Uniform
from studies._spaces import PPO

STUDY = Study(
    name="dungeon_ppo",
    description="Masked PPO on DungeonCrawl-v1: lr, gamma, GAE lambda, clip, entropy, value coef",
    env="DungeonCrawl-v1",
    algo="ppo",
    config=dict(num_envs=32, num_steps=64, num_minibatches=4, update_epochs=2, hidden=(64, 64),
                activation="relu", updates_per_chunk=10, use_action_mask=True,
                eval_policy="sample", eval_episodes=32),
    space=dict(
        **PPO,
        vf_coef=Uniform(0.25, 1.0),
    ),
    final_seeds=8,
    reference=-0.86,
    reference_label="random masked play",
    cpu=Budget(trials=6, configs_per_trial=4, seeds=2, timesteps=500_000),
    gpu=Budget(trials=16, configs_per_trial=64, seeds=8, timesteps=2_000_000),
    smoke=Budget(trials=2, configs_per_trial=2, seeds=2, timesteps=4_096),
)
