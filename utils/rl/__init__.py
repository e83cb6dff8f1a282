"""The RL core every training stage shares: token log-probs and statistics, KL estimators and controllers, the
entropy bonus's coefficient, rewards and their normalisation, advantage estimators, the policy / value /
preference losses, the experience type and the frozen models. Steps import from here; nothing here imports a step.

Every function here is small, pure (it never modifies its inputs) and works on plain tensors, so each can be
unit-tested on values worked out by hand (tests/utils/rl/).

Conventions
-----------
* Per-token tensors cover the ANSWER (action) positions only and have shape (B, A): position t is the t-th
  generated token, so ``logprobs[:, t]`` is log pi(answer_t | prompt, answer_<t).
* ``action_mask`` (B, A) is 1.0 on real answer tokens, the EOS token INCLUDED, and 0.0 on the padding after
  it. It is a prefix mask: a row's real tokens are positions 0 .. n-1 with n = action_mask[row].sum(). The EOS
  must stay inside the mask, or stopping is never reinforced.
* Every row of a real batch has n >= 1 (an empty answer still has its EOS). A row with n = 0 is nevertheless
  handled without NaN: each function's docstring says what such a row gives (always zeros or "contributes
  nothing").
* Masks are binary (0.0 / 1.0). Masked-out values are multiplied by 0, so they must be finite.

References (read, not copied): Schulman, "Approximating KL divergence" (2020) for k1/k2/k3; Ziegler et al.,
"Fine-Tuning Language Models from Human Preferences" (2019) for the adaptive KL controller; He et al., "Skywork
Open Reasoner 1 Technical Report" (2025) for adaptive entropy control; Schulman et al.,
"High-Dimensional Continuous Control Using GAE" (2015); Huang et al., "The N+ Implementation Details of RLHF
with PPO" (2024); TRL, OpenRLHF, torchtune and DeepSpeed-Chat.
"""
