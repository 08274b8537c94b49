"""An "hf" rollout for verl 0.9.x on a CPU: verl 0.9 serves rollouts from vLLM / SGLang / TRT-LLM servers only.

  HFRolloutServer  a Ray actor with its own copy of the policy, answering verl's agent loop with HF generate
  HFReplica        verl's RolloutReplica for it (RolloutReplicaRegistry "hf"): one server per replica
  HFServerAdapter  lives in the hybrid actor worker (verl's rollout registry, ("hf", "async")): after every actor
                   update, verl's checkpoint manager hands it the new weights, which it loads into the server
Every generate call and every weight load is traced (tests.verl_cpu.trace.record).
"""
import os

import ray
import torch
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

from tests.verl_cpu.trace import record

SERVER_NAME = "verl_cpu_hf_server_{}"


class HFRolloutServer:
    """The rollout 'server': HF generate on a private copy of the policy; the trainer pushes weights in."""

    def __init__(self, model_path, response_length, seed=0):
        from transformers import AutoModelForCausalLM
        torch.manual_seed(seed)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.response_length = response_length
        self.eos, self.pad = self.model.generation_config.eos_token_id, self.model.generation_config.pad_token_id

    def load_weights(self, named_tensors):
        before = {name: tensor.clone() for name, tensor in self.model.state_dict().items()}
        missing, unexpected = self.model.load_state_dict(dict(named_tensors), strict=False)
        changed = sum(not torch.equal(before[name], tensor) for name, tensor in self.model.state_dict().items())
        record("rollout:load_weights", tensors=len(named_tensors), changed=changed, missing=list(missing),
               unexpected=list(unexpected))

    @torch.no_grad()
    def generate(self, request_id=None, prompt_ids=None, sampling_params=None, **_):
        params = dict(sampling_params or {})
        temperature = float(params.get("temperature", 1.0) or 0.0)
        top_k, top_p = int(params.get("top_k", -1) or -1), float(params.get("top_p", 1.0) or 1.0)
        max_new_tokens = int(params.get("max_tokens") or params.get("max_new_tokens") or self.response_length)
        ids = torch.tensor([list(prompt_ids)])
        sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=max(top_k, 0)) \
            if temperature > 0 else dict(do_sample=False)
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                  pad_token_id=self.pad, eos_token_id=self.eos, return_dict_in_generate=True,
                                  output_logits=True, **sampling)
        tokens = out.sequences[0, ids.shape[1]:].tolist()
        if self.eos in tokens:  # keep the EOS token, as vLLM does
            tokens = tokens[:tokens.index(self.eos) + 1]
        log_probs = None
        if params.get("logprobs"):
            logits = torch.stack(out.logits, dim=1)[0, :len(tokens)].float() / (temperature or 1.0)
            log_probs = logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()
        record("rollout:generate", prompt=len(prompt_ids), response=len(tokens), temperature=temperature)
        return TokenOutput(token_ids=tokens, log_probs=log_probs, stop_reason="completed")

    # The control calls verl's trainer and checkpoint manager make on a server: nothing to do for HF generate.
    def wake_up(self):
        pass

    sleep = clear_kv_cache = release_kv_cache = resume_kv_cache = resume_generation = stop_profile = wake_up
    wait_for_requests_to_drain = wake_up

    def abort_all_requests(self, reject_request=False):
        return {}

    def start_profile(self, **_):
        pass


class HFReplica(RolloutReplica):
    """One HF server per replica; in hybrid mode the replica's workers are the actor's FSDP workers."""

    async def launch_servers(self):
        config = self.model_config
        model_path = config.get("path") if hasattr(config, "get") else config.path
        name = SERVER_NAME.format(self.replica_rank)
        server = ray.remote(HFRolloutServer).options(name=name, num_cpus=0, max_concurrency=1).remote(
            model_path, self.config.response_length)
        self.servers, self._server_handle, self._server_address = [server], server, name


class HFServerAdapter(rollout_base.BaseRollout):
    """In the hybrid actor worker: receives the actor's weights after each update and loads them into the server."""

    def __init__(self, config, model_config, device_mesh, *args, **kwargs):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        per_replica = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        self.replica_rank, self.is_leader = rank // per_replica, rank % per_replica == 0

    async def resume(self, tags):
        pass

    async def release(self):
        pass

    async def update_weights(self, weights, wire_format="named_tensors", **kwargs):
        named = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        if self.is_leader:
            await ray.get_actor(SERVER_NAME.format(self.replica_rank)).load_weights.remote(named)


rollout_base._ROLLOUT_REGISTRY[("hf", "async")] = f"{__name__}.HFServerAdapter"
RolloutReplicaRegistry.register("hf", lambda: HFReplica)
