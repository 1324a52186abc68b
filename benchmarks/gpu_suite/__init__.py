"""One command that checks and times lfed on a device (issues 28 and 37): correctness, timings, profile, the limit.

    python benchmarks/gpu_suite.py --device cpu --quick --out /tmp/gpu_suite      # CI (tests/benchmarks/test_gpu_suite.py), < 1 min
    python3 benchmarks/gpu_suite.py --device cuda --out $OUT/gpu_suite           # on a GPU: at most --budget-s (480 s)

Writes ``<out>/gpu_suite.json`` (everything, rewritten after every section, check and timing case, so
a run killed at its time limit still leaves what it measured) and ``<out>/gpu_suite.md`` (tables).
One process (and, for set-up, one child process per measurement); the sections are independent: an
error in one is recorded (with its traceback) and the suite goes on. A row that cannot run here (a
package missing, a CUDA-only measurement on the CPU) says skipped and why; nothing is filled in.
Exit status: 0 all passed, 1 a correctness check failed, 2 a section or a case raised (and no check
failed).

0. environment: Python, torch, CUDA, cuDNN, device name and capability, TF32 flags, threads, and
   whether lightning / jsonargparse / wandb / torchvision / sklearn import. lfed is imported from
   this checkout (``sys.path``), driven through its Python API only (no ``lfed fit`` CLI, no
   jsonargparse, no wandb: the GPU machine has neither).
1. correctness on the device, each check with an explicit tolerance and the max difference seen:
   vmap vs loop backends in float64 (the quickstart's FedAvg MLP on digits; SmallCNN with SCAFFOLD,
   IGFL time attention, EFL with compression and stragglers); the quickstart on the device against
   the same run on the CPU in float32; a run stopped at round 3 and resumed to 6 against one of 6
   rounds, bit for bit on the device; ``client_state="host"`` (pinned memory on CUDA) against
   ``"device"``, bit for bit; every robust rule and every attack that draws no random numbers
   (docs/robustness.md) on a fixed float64 cohort of updates, on the device against the CPU.
2. set-up in its parts (section ``setup``): a fresh ``python -c`` child (cold imports) times, with
   ``time.perf_counter`` around each part, ``import torch``, ``import lightning.pytorch``, lfed's
   import, the device's initialisation, making the synthetic data, building the data module + module
   + trainer, ``fit`` to the first round (the data's move to the device included), the first round and
   the steady round of the timing job below at cohort 50 (quick: 2). lfed's own part = build + fit to
   the first round + the first round (imports excluded); issue 37 wants it under 1 s: recorded as
   ``lfed_own_under_1s``. 2 children (quick: 1); the medians are reported beside each child.
3. host synchronizations per round (section ``host_sync``): rounds 2-4 (quick: 2-3) of FedAvg (the
   quickstart), SCAFFOLD, DP-FedAvg (configs/dp_digits.yaml), Ditto and a LoRA run
   (configs/lora_digits.yaml; skipped without peft), each from ``on_train_batch_start`` to
   ``on_train_batch_end``: on CUDA the warnings of ``torch.cuda.set_sync_debug_mode("warn")`` per round
   (issue 37's target: at most 1); on the CPU that count is recorded as "not applicable on cpu". On
   every device the calls of ``aten._local_scalar_dense`` (``.item()``, ``bool``/``float``/``int`` of a
   tensor) per round, seen by a ``TorchDispatchMode``: the host-side count behind the syncs.
4. timing of pfl-research's CIFAR-10 benchmark job on SYNTHETIC CIFAR-shaped data (random images
   and labels, not CIFAR-10): 1,000 clients of 50 images, FedAvg, 1 local epoch of batch 10 (5
   local steps), pfl's 2-conv + 128-dense CNN (:class:`PflCNN`, 1,626,442 parameters at 32x32),
   evaluation every 10 rounds: steady seconds per round (median of the timed rounds, warm-up
   excluded, synchronized on CUDA) and peak device memory (``max_memory_allocated``, reset per case;
   on the CPU the peak RSS, reset per case through /proc/self/clear_refs where Linux allows it) at
   cohorts 50, 200 and 1,000 of:
   * lfed vmap, lfed loop (``FederatedModule`` under a Lightning ``Trainer``); at the smallest cohort also
     lfed vmap with its convolutions forced to each form (``LFED_CONV_FORM=native`` / ``matmul``,
     :mod:`lfed.engine.conv`: torch's grouped convolution against unfold + one batched matmul);
   * hand vmap: the ~60 lines of plain PyTorch of ../shared/gpu/2026-11-26-h200/README.md section 3
     (:meth:`Suite.hand_vmap_case`: the cohort's weights stacked, one eager ``vmap(grad(loss))`` per
     local step, SGD in place, the mean as the new model, the examples gathered from one device tensor);
   * centralized: the work of a round without federation (per local step, one forward/backward/SGD
     step of the single model over that step's K x B examples as one batch; same net, device, steps);
   * plain loop: one model, ``torch.optim.SGD`` per client, the weighted mean;
   * pfl (1 process), at cohorts 50 and 1,000: pfl-research itself (``SimulatedBackend``,
     ``FederatedAveraging``, ``PyTorchModel``) when ``import pfl`` works, else skipped with the reason
     "pfl not importable (...)" (its best of 2-5 processes is not run here);
   * a grid of 18 runs (6 client lrs x 3 seeds, cohort 50) as one group against the 18 runs one after
     another, with the group's throughput over one run's: run-rounds/s of the group over rounds/s of
     lfed vmap alone at that cohort.
   Every row gets TFLOP/s: examples per round x the FLOPs of one training step per example (forward +
   backward, counted once by ``torch.utils.flop_counter.FlopCounterMode``: 99.5 MFLOP at 32x32) over
   its steady s/round; the lfed rows their ratios to the plain loop, the hand vmap and the centralized
   row; and issue 37's GPU targets are listed with the measured ratios (lfed / hand vmap <= 1 and
   lfed / centralized <= 3 at cohort 50, <= 2 at 1,000; the grid's throughput >= 3x one run's).
5. a ``torch.profiler`` summary of one lfed vmap round (kernel time against launch and Python
   overhead per local step, top ops), and the vmapped local step eager / recorded (lfed's
   ``make_fx`` replay) / ``torch.compile``-d / replayed as a CUDA graph: each variant's time and
   its difference from the eager step; ``keep`` = exact (bit for bit) and faster than lfed's
   recorded step. Nothing in lfed is changed by this: it is the evidence for such a change.
6. bf16-mixed against float32 (section ``precision``): the timing job's lfed vmap round at cohort 50
   under ``Trainer(precision="bf16-mixed")`` and ``"32-true"``, and the test accuracy of the
   quickstart (digits MLP, 60 rounds; quick: 6) in both, seeds 0 and 1 (quick: 0).
7. a LoRA cohort against a peft loop (section ``lora``): ``benchmarks/adapters_cohort.py``'s
   ``measure`` in this process on the suite's device, K = 50 and 200 (quick: 2, a tiny model): lfed's
   engine against one peft model trained client after client, with client 0's adapters compared;
   skipped with the reason without peft.
8. the personalized evaluation of every client (section ``personal_eval``, ``benchmarks/personal_eval.py``'s
   helpers): Ditto's personal model set for every one of N = 1,000 and 10,000 clients (quick: 20),
   ``FederatedRun.personal_evaluation`` (vmapped) against a per-client ``functional_call`` loop, the
   accuracies checked equal.
9. a BatchNorm ResNet's local training (section ``resnet``, issue 53): ResNet-18 with BatchNorm, 50 clients of 64
   random 32x32 images, 5 steps of batch 32 (quick: a ResNet-20 of width 4, 2 clients, 8x8): one
   ``CohortTrainer.train`` call on the vmap backend (each client's running statistics its own row) against the loop
   backend, the centralized step over the same examples, and vmap with ``crop_flip`` redrawn every step; medians
   of 3 (quick: 1), interleaved. Not bounded by ``--budget-s``: run it alone with ``--sections resnet``.
10. example-level DP-SGD (section ``dp_sgd``, issue 54, ``benchmarks/dp_sgd_opacus.py``): K = 10, 100, 1,000 clients
   of the MNIST 2NN (quick: 2 clients of a tiny MLP) in one ``CohortTrainer.train`` call against Opacus client after
   client on the same Poisson batches; client 0's noise-free weights checked against Opacus's first. Skipped, with
   the reason, without opacus (carry its wheel). Not bounded by ``--budget-s``.

``--quick`` shrinks everything (a few clients, 12x12 images, a grid of 3 runs, the compile
backend ``aot_eager``, tiny LoRA and personalization jobs) so the suite runs on the CPU in well
under a minute (about 35 s of suite and 10 s of start-up on this 2-core machine).
``--budget-s`` (default 480 s) bounds the whole run: a timing case that would start past
``budget - reserve`` (the reserve, 240 s, is kept for sections 5-8), or whose estimate (its method's
last s/round scaled by the cohort) would overrun it, is recorded as skipped with the reason; the
cases of sections 6-8 are skipped the same way against what is left of the whole budget; a case also
stops timing once it has spent ``--case-cap-s`` with at least 3 timed rounds.

On the device tool's GPU machine (see /work/.library/device/README.md): it has no package index
and another torch (2.11 in Nov. 2026), with lightning, sklearn and torchvision but no wandb or
jsonargparse, none of which this suite needs (nor, there, pfl or peft: those rows say skipped); the
tool sends the session's own checkout (not a helper's worktree), so the suite must be committed
there first. Nothing needs carrying. One command, well inside the 10-minute limit of a call:

    mkdir -p $OUT/gpu_suite && PYTHONUNBUFFERED=1 WANDB_MODE=disabled python3 benchmarks/gpu_suite.py \
        --device cuda --out $OUT/gpu_suite --budget-s 480 2>&1 | tee $OUT/gpu_suite/log.txt

(timeout_s=600; gpu_suite.json, gpu_suite.md and log.txt come back, one folder down.)
"""

from .common import PflCNN, train_flops_per_example, trainer_for

__all__ = ["PflCNN", "train_flops_per_example", "trainer_for"]
