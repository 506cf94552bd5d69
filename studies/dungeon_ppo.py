"""Masked PPO on DungeonCrawl-v1, the grid game where most of the 15 actions are illegal."""

from harness.space import Budget, Study, Uniform
from studies._spaces import PPO

STUDY = Study(
    name="dungeon_ppo",
    description="Masked PPO on DungeonCrawl-v1: lr, gamma, GAE lambda, clip, entropy, value coef",
    env="DungeonCrawl-v1",
    algo="ppo",
    config=dict(num_envs=32, num_steps=64, num_minibatches=4, update_epochs=2, hidden=(64, 64),
                activation="relu", updates_per_chunk=10, use_action_mask=True),
    space=dict(
        **PPO,
        vf_coef=Uniform(0.25, 1.0),
    ),
    cpu=Budget(trials=12, configs_per_trial=4, seeds=2, timesteps=500_000),
    gpu=Budget(trials=16, configs_per_trial=64, seeds=8, timesteps=2_000_000),
    smoke=Budget(trials=2, configs_per_trial=2, seeds=2, timesteps=4_096),
)
