"""Stand-ins for the parts of transformers and Lightning that the gpuguard
adapters touch, for machines where neither library is installed (neither is
packaged for Debian). They run real torch and follow the libraries' own
control flow for exactly the hooks the adapters use, as read in their
sources (transformers' Trainer.training_step / compute_loss and the
accumulation loop of _inner_training_loop; Lightning 2.x's
_AutomaticOptimization, Closure, Strategy.training_step / backward,
Precision.pre_backward / backward / post_backward,
_block_parallel_sync_behavior), so that an adapter that breaks against the
real libraries' ordering breaks here too:

- HF: training_step computes the loss through self.compute_loss, divides it
  by the accumulation steps unless the loss is normalized by
  num_items_in_batch (model_accepts_loss_kwargs) or compute_loss_func is
  set, backpropagates through the accelerator and returns it detached; every
  accumulation step but the last runs under accelerator.no_sync(model).
- Lightning: the closure runs training_step (through the strategy), then
  zero_grad (on the first batch of an accumulation cycle), then backward of
  the loss divided by accumulate_grad_batches; batches that accumulate run
  under strategy.block_backward_sync(), the others inside optimizer.step.

Both record which backward passes would have synchronized gradients across
ranks (outside no_sync / block_backward_sync), and how many samples each
optimizer step saw.

    modules = standins.transformers_modules()   # {"transformers": ...}
    modules = standins.lightning_modules()      # {"lightning": ..., "lightning.pytorch": ...}
"""

import collections
import contextlib
import inspect
import types

import torch


class SyncLog(object):
    """What a DDP wrapper would have done: backward passes that synchronized
    (per optimizer step), and samples seen (per optimizer step)."""

    def __init__(self):
        self.blocked = 0
        self.synced = [0]
        self.samples = [0]

    @contextlib.contextmanager
    def no_sync(self):
        self.blocked += 1
        try:
            yield
        finally:
            self.blocked -= 1

    def backward(self):
        if not self.blocked:
            self.synced[-1] += 1

    def optimizer_step(self):
        self.synced.append(0)
        self.samples.append(0)


# --- transformers ---------------------------------------------------------------

class TrainingArguments(object):
    def __init__(self, per_device_train_batch_size=8, gradient_accumulation_steps=1,
                 learning_rate=0.05, n_gpu=1):
        self.per_device_train_batch_size = per_device_train_batch_size
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.learning_rate = learning_rate
        self.n_gpu = n_gpu


class Accelerator(object):
    def __init__(self, log):
        self.log = log

    def backward(self, loss, **kwargs):
        self.log.backward()
        loss.backward(**kwargs)

    def no_sync(self, model):
        return self.log.no_sync()


class Trainer(object):
    """transformers.Trainer: the training loop's accumulation and the
    training_step / compute_loss pair."""

    def __init__(self, model=None, args=None, train_dataset=None, compute_loss_func=None,
                 optimizers=(None, None)):
        self.model = model
        self.args = args
        self.train_dataset = train_dataset
        self.compute_loss_func = compute_loss_func
        self.optimizer = optimizers[0]
        self.sync = SyncLog()
        self.accelerator = Accelerator(self.sync)
        params = inspect.signature(model.forward).parameters
        self.model_accepts_loss_kwargs = "num_items_in_batch" in params or any(
            p.kind == p.VAR_KEYWORD for p in params.values())
        self.current_gradient_accumulation_steps = args.gradient_accumulation_steps

    def get_train_dataloader(self):
        """Batches of per_device_train_batch_size: dicts of stacked tensors
        (and the samples' other values, from the first sample)."""
        b = self.args.per_device_train_batch_size
        data = self.train_dataset
        for i in range(0, len(data), b):
            samples = data[i:i + b]
            batch = {}
            for key, value in samples[0].items():
                batch[key] = (torch.stack([s[key] for s in samples])
                              if isinstance(value, torch.Tensor) else value)
            yield batch

    def train(self):
        model, ga = self.model, self.args.gradient_accumulation_steps
        if self.optimizer is None:
            self.optimizer = torch.optim.SGD(model.parameters(), lr=self.args.learning_rate,
                                             momentum=0.9)
        batches = list(self.get_train_dataloader())
        for start in range(0, len(batches), ga):
            batch_samples = batches[start:start + ga]
            num_items_in_batch = None
            if self.model_accepts_loss_kwargs:
                num_items_in_batch = sum(int(b["labels"].numel()) for b in batch_samples)
            for i, inputs in enumerate(batch_samples):
                self.sync.samples[-1] += len(inputs["labels"])
                last = i == len(batch_samples) - 1
                with contextlib.nullcontext() if last else self.accelerator.no_sync(model):
                    self.training_step(model, inputs, num_items_in_batch)
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.sync.optimizer_step()

    def _prepare_inputs(self, inputs):
        return type(inputs)(inputs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        inputs = self._prepare_inputs(inputs)
        loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        del inputs
        if self.args.n_gpu > 1:
            loss = loss.mean()
        if ((not self.model_accepts_loss_kwargs or num_items_in_batch is None)
                and self.compute_loss_func is None):
            loss = loss / self.current_gradient_accumulation_steps
        self.accelerator.backward(loss)
        return loss.detach()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = None
        if self.compute_loss_func is not None and "labels" in inputs:
            labels = inputs.pop("labels")
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            inputs = dict(inputs, num_items_in_batch=num_items_in_batch)
        outputs = model(**inputs)
        if labels is not None:
            loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
        else:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs[0]
        return (loss, outputs) if return_outputs else loss


def transformers_modules():
    m = types.ModuleType("transformers")
    m.Trainer = Trainer
    m.TrainingArguments = TrainingArguments
    return {"transformers": m}


# --- Lightning ---------------------------------------------------------------------

class Callback(object):
    def on_train_start(self, trainer, pl_module):
        pass

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        pass

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pass

    def on_before_backward(self, trainer, pl_module, loss):
        pass

    def on_after_backward(self, trainer, pl_module):
        pass

    def on_train_end(self, trainer, pl_module):
        pass

    def teardown(self, trainer, pl_module, stage):
        pass


class LightningModule(torch.nn.Module):
    automatic_optimization = True

    def __init__(self):
        super(LightningModule, self).__init__()
        self.trainer = None

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        optimizer.zero_grad()

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        optimizer.step(closure=optimizer_closure)

    def backward(self, loss, *args, **kwargs):
        loss.backward(*args, **kwargs)

    def on_before_backward(self, loss):
        pass

    def on_after_backward(self):
        pass


class Precision(object):
    def pre_backward(self, tensor, module):
        module.trainer._hook("on_before_backward", tensor)
        module.on_before_backward(tensor)
        return tensor

    def backward(self, tensor, model, optimizer, *args, **kwargs):
        model.backward(tensor, *args, **kwargs)

    def post_backward(self, tensor, module):
        module.trainer._hook("on_after_backward")
        module.on_after_backward()
        return tensor

    @contextlib.contextmanager
    def train_step_context(self):
        yield


class Strategy(object):
    """A parallel strategy on one process: block_backward_sync as DDP's, the
    synchronization recorded instead of done."""

    handles_gradient_accumulation = False

    def __init__(self, log):
        self.log = log
        self.lightning_module = None
        self.precision_plugin = Precision()

    def training_step(self, *args, **kwargs):
        with self.precision_plugin.train_step_context():
            return self.lightning_module.training_step(*args, **kwargs)

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        module = self.lightning_module
        closure_loss = self.precision_plugin.pre_backward(closure_loss, module)
        self.log.backward()
        self.precision_plugin.backward(closure_loss, module, optimizer, *args, **kwargs)
        return self.precision_plugin.post_backward(closure_loss, module)

    def block_backward_sync(self):
        return self.log.no_sync()


class Closure(object):
    """Lightning's closure: training step, zero_grad, backward, in that order."""

    def __init__(self, step_fn, backward_fn, zero_grad_fn):
        self.step_fn, self.backward_fn, self.zero_grad_fn = step_fn, backward_fn, zero_grad_fn
        self.result = None

    def __call__(self):
        with torch.enable_grad():
            loss = self.step_fn()
            if self.zero_grad_fn is not None:
                self.zero_grad_fn()
            if loss is not None:
                self.backward_fn(loss)
        self.result = loss
        return None if loss is None else loss.detach()


class LightningTrainer(object):
    def __init__(self, max_epochs=1, accumulate_grad_batches=1, callbacks=()):
        self.max_epochs = max_epochs
        self.accumulate_grad_batches = accumulate_grad_batches
        self.callbacks = list(callbacks)
        self.sync = SyncLog()
        self.strategy = Strategy(self.sync)
        self.optimizers = []
        self.current_epoch = 0
        self.losses = []

    def _hook(self, name, *args):
        for cb in self.callbacks:
            getattr(cb, name)(self, self.strategy.lightning_module, *args)

    def fit(self, module, train_dataloaders):
        module.trainer = self
        self.strategy.lightning_module = module
        self.optimizers = [module.configure_optimizers()]
        self._hook("on_train_start")
        for self.current_epoch in range(self.max_epochs):
            batches = list(train_dataloaders)
            for batch_idx, batch in enumerate(batches):
                self._hook("on_train_batch_start", batch, batch_idx)
                self.sync.samples[-1] += len(batch[0])
                out = self._run(module, batch, batch_idx, batch_idx == len(batches) - 1)
                self._hook("on_train_batch_end", out, batch, batch_idx)
        self._hook("on_train_end")
        self._hook("teardown", "fit")

    def _run(self, module, batch, batch_idx, last):
        accum = self.accumulate_grad_batches
        optimizer = self.optimizers[0]
        kwargs = collections.OrderedDict(batch=batch, batch_idx=batch_idx)

        def step_fn():
            output = getattr(self.strategy, "training_step")(*kwargs.values())
            loss = output.get("loss") if isinstance(output, dict) else output
            return None if loss is None else loss / accum

        def zero_grad_fn():
            module.optimizer_zero_grad(self.current_epoch, batch_idx, optimizer)

        closure = Closure(step_fn, lambda loss: self.strategy.backward(loss, optimizer),
                          zero_grad_fn if batch_idx % accum == 0 else None)
        if (batch_idx + 1) % accum != 0 and not last:
            with self.strategy.block_backward_sync():
                closure()
        else:
            module.optimizer_step(self.current_epoch, batch_idx, optimizer, closure)
            self.sync.optimizer_step()
        if closure.result is not None:
            self.losses.append(float(closure.result) * accum)
        return closure.result


def lightning_modules():
    top = types.ModuleType("lightning")
    pl = types.ModuleType("lightning.pytorch")
    pl.Callback = Callback
    pl.LightningModule = LightningModule
    pl.Trainer = LightningTrainer
    top.pytorch = pl
    return {"lightning": top, "lightning.pytorch": pl}
