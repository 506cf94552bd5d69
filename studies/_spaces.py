"""Search spaces shared by several studies."""

from harness import LogUniform, Uniform

SAC = dict(
    actor_lr=LogUniform(1e-4, 3e-3),
    critic_lr=LogUniform(1e-4, 3e-3),
    alpha_lr=LogUniform(1e-4, 3e-3),
    gamma=Uniform(0.95, 0.995),
    tau=LogUniform(1e-3, 5e-2),
    target_entropy_scale=Uniform(0.25, 1.5),
)

PPO = dict(
    lr=LogUniform(1e-4, 3e-3),
    gamma=Uniform(0.95, 0.999),
    gae_lambda=Uniform(0.8, 0.99),
    clip_eps=Uniform(0.1, 0.3),
    ent_coef=LogUniform(1e-4, 3e-2),
)

PQN = dict(
    lr=LogUniform(1e-4, 3e-3),
    gamma=Uniform(0.95, 0.999),
    td_lambda=Uniform(0.5, 0.95),
    exploration_fraction=Uniform(0.1, 0.6),
    eps_end=LogUniform(0.01, 0.2),
)
