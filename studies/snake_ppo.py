"""PPO on Snake-v1 (10x10): PPO's hyperparameters and the network (MLP or cell transformer).

The network is a static choice, so MLP and transformer configurations run in separate trials.
The transformer's tokens are 2x2 squares of cells (25 tokens, not 100: attention's cost falls
with their square); the GPU budget is where the comparison is meant to be made. A return is apples
eaten, less 1 for a death; tuned vs default is also stated above random play's return
(``reference``; tests/test_grid_envs.py checks it).
"""

from harness import Budget, Categorical, Study
from studies._spaces import PPO

STUDY = Study(
    name="snake_ppo",
    description="PPO on Snake-v1 10x10: lr, gamma, GAE lambda, clip, entropy; network mlp|transformer",
    env="Snake-v1",
    algo="ppo",
    config=dict(num_envs=32, num_steps=64, num_minibatches=4, update_epochs=2, hidden=(64, 64),
                activation="relu", embed_dim=16, num_heads=2, num_layers=1, patch=2, updates_per_chunk=10,
                eval_episodes=16),
    space=dict(
        **PPO,
        network=Categorical(("mlp", "transformer")),  # static: splits trials
    ),
    reference=-0.89,
    reference_label="random play",
    cpu=Budget(trials=6, configs_per_trial=2, seeds=2, timesteps=300_000),
    gpu=Budget(trials=16, configs_per_trial=32, seeds=8, timesteps=5_000_000),
    smoke=Budget(trials=2, configs_per_trial=2, seeds=2, timesteps=4_096),
)
