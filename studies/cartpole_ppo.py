"""PPO on CartPole-v1: learning rate, discounting, clipping, entropy; minibatch count is static."""

from harness import Budget, Categorical, Study, Uniform
from studies._spaces import PPO

STUDY = Study(
    name="cartpole_ppo",
    description="PPO on CartPole-v1: lr, gamma, GAE lambda, clip, entropy, value coef; minibatches",
    env="CartPole-v1",
    objective="auc",  # final return saturates at 500: rank by how soon it gets there and stays
    algo="ppo",
    config=dict(num_envs=4, num_steps=128, update_epochs=4, updates_per_chunk=10),
    space=dict(
        **PPO,
        vf_coef=Uniform(0.25, 1.0),
        num_minibatches=Categorical((4, 8)),  # static: splits trials
    ),
    cpu=Budget(trials=8, configs_per_trial=4, seeds=3, timesteps=100_000),
    gpu=Budget(trials=16, configs_per_trial=64, seeds=16, timesteps=500_000),
    smoke=Budget(trials=2, configs_per_trial=2, seeds=2, timesteps=20_480),
)
