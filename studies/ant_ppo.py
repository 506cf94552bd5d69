"""PPO on Brax's Ant (MuJoCo-style physics in JAX, positional backend): the locomotion settings."""

from harness import Budget, Categorical, LogUniform, Study, Uniform

STUDY = Study(
    name="ant_ppo",
    description="PPO on Brax Ant (needs .[brax]): lr, entropy, gamma, GAE, clip, reward scale; unroll length",
    env="brax:ant:positional",  # positional: Brax's cheapest backend to compile and step on a CPU
    algo="ppo",
    objective="auc",  # a locomotion return keeps growing with the budget: reward getting there sooner
    config=dict(num_envs=64, num_minibatches=8, update_epochs=4, updates_per_chunk=10, hidden=(128, 128),
                normalize_observations=True, squash="tanh", clip_value_loss=False, eval_episodes=4),
    hparams=dict(max_grad_norm=1.0),
    baseline=dict(num_steps=10),
    space=dict(
        lr=LogUniform(1e-4, 1e-3),
        ent_coef=LogUniform(1e-4, 1e-2),
        gamma=Uniform(0.95, 0.995),
        gae_lambda=Uniform(0.9, 0.99),
        clip_eps=Uniform(0.1, 0.3),
        reward_scale=LogUniform(0.01, 1.0),
        num_steps=Categorical((5, 10, 20)),  # unroll length: static, splits trials
    ),
    curve_episodes=2,  # an ant episode is up to 1000 steps
    cpu=Budget(trials=4, configs_per_trial=2, seeds=2, timesteps=200_000),
    gpu=Budget(trials=8, configs_per_trial=32, seeds=8, timesteps=10_000_000),
    smoke=Budget(trials=2, configs_per_trial=1, seeds=2, timesteps=12_800),
)
