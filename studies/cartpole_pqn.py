"""PQN on CartPole-v1: learning rate, discounting, lambda, exploration; minibatch count is static."""

from harness import Budget, Categorical, Study
from studies._spaces import PQN

STUDY = Study(
    name="cartpole_pqn",
    description="PQN on CartPole-v1: lr, gamma, Q(lambda), epsilon schedule; minibatches",
    env="CartPole-v1",
    objective="auc",  # final return saturates at 500: rank by how soon it gets there and stays
    algo="pqn",
    config=dict(num_envs=16, num_steps=128, update_epochs=5, updates_per_chunk=8),
    space=dict(**PQN, num_minibatches=Categorical((8, 16))),  # static: splits trials
    cpu=Budget(trials=8, configs_per_trial=4, seeds=2, timesteps=200_000),
    gpu=Budget(trials=16, configs_per_trial=64, seeds=16, timesteps=500_000),
    smoke=Budget(trials=2, configs_per_trial=2, seeds=2, timesteps=32_768),
)
