"""The step's loss statistics, summed over its micro-batches on the device and read once (fast/update.py)."""
import torch


class StepStats:
    """Sums policy_loss's stats over a step's micro-batches on the device, weighted by each
    micro-batch's share of its mini-batch, and reads them once (no sync per micro-batch).
    ratio_max is a max, grad_norm the mean over optimizer steps; loss and entropy (the token-mean
    entropy of the micro-batch) are added to the stats."""
    def __init__(self):
        self.sums, self.weight, self.grad_norms = {}, 0.0, []

    def add(self, loss_stats, loss, entropy, mask, *, weight):
        loss_stats = {**loss_stats, "loss": loss.detach(),
                      "entropy": (entropy * mask).sum() / mask.sum().clamp_min(1)}
        for key, value in loss_stats.items():
            self.sums[key] = (torch.maximum(self.sums.get(key, value), value) if key == "ratio_max"
                              else self.sums.get(key, 0.0) + value * weight)
        self.weight = self.weight + weight

    def result(self):
        """-> python floats: each stat's weighted mean (ratio_max: max), grad_norm,
        optimizer_steps."""
        out = {key: (value if key == "ratio_max" else value / self.weight).item()
               for key, value in self.sums.items()}
        if self.grad_norms:
            out["grad_norm"] = torch.stack(self.grad_norms).mean().item()
        return {**out, "optimizer_steps": len(self.grad_norms)}
