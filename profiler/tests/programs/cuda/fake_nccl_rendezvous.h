/* How the ranks of the stand-in NCCL (fake_nccl.c) meet: the segment a communicator's ranks share,
 * a call as the ranks match it, the collectives' generation-counting barrier and the counters that
 * pair sends with receives. Included once, by fake_nccl.c, after nccl.h's types: one translation
 * unit, built by the same commands. */
#ifndef FAKE_NCCL_RENDEZVOUS_H
#define FAKE_NCCL_RENDEZVOUS_H

#define MAX_RANKS 64
/* The segment that the ranks of a communicator share. */
struct shared {
	_Atomic uint32_t initialised; /* set once by the creator, after nranks */
	int nranks;
	_Atomic uint32_t arrived;    /* ranks at the barrier in this generation */
	_Atomic uint32_t generation; /* futex word: bumped by the last rank to arrive */
	_Atomic uint32_t p2p;        /* futex word: bumped by every send or receive posted */
	_Atomic uint32_t sent[MAX_RANKS][MAX_RANKS], received[MAX_RANKS][MAX_RANKS]; /* [from][to] */
};

struct ncclComm {
	struct shared *s;
	int rank, nranks;
	unsigned long long calls;
};

enum coll { AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AlltoAll, Gather, Scatter, Send, Recv };

struct call {
	enum coll coll;
	ncclDataType_t type;
	ncclRedOp_t op;
	int peer; /* root or peer; 0 when neither */
	size_t count;
	ncclComm_t comm;
	cudaStream_t stream;
	uint32_t ticket; /* a send's or receive's number with its peer */
};

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000ULL + t.tv_nsec;
}

static uint64_t deadline(void)
{
	const char *v = getenv("FAKE_NCCL_TIMEOUT_S");
	return now_ns() + (v && *v ? strtoull(v, NULL, 0) : 300) * 1000000000ULL;
}

/* Sleeps while a shared futex word holds `seen`, 100 ms at most. */
static void futex_wait(_Atomic uint32_t *word, uint32_t seen)
{
	struct timespec t = { 0, 100 * 1000000L };
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &t, NULL, 0);
}
static void futex_wake(_Atomic uint32_t *word) { syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

/* Returns when every rank has arrived as many times as this one. */
static ncclResult_t barrier(struct ncclComm *c, uint64_t until)
{
	struct shared *s = c->s;
	uint32_t gen = atomic_load(&s->generation);

	if (atomic_fetch_add(&s->arrived, 1) + 1 == (uint32_t)c->nranks) {
		atomic_store(&s->arrived, 0);
		atomic_fetch_add(&s->generation, 1);
		futex_wake(&s->generation);
		return ncclSuccess;
	}
	while (atomic_load(&s->generation) == gen) {
		if (now_ns() > until)
			return ncclRemoteError;
		futex_wait(&s->generation, gen);
	}
	return ncclSuccess;
}

/* A send counts in sent[me][peer] and waits for received[me][peer]; a receive the other way. */
static _Atomic uint32_t *p2p_counter(const struct call *c, int mine)
{
	struct shared *s = c->comm->s;
	int me = c->comm->rank, peer = c->peer;
	if (c->coll == Send)
		return mine ? &s->sent[me][peer] : &s->received[me][peer];
	return mine ? &s->received[peer][me] : &s->sent[peer][me];
}

static void p2p_post(struct call *c)
{
	c->ticket = atomic_fetch_add(p2p_counter(c, 1), 1) + 1;
	atomic_fetch_add(&c->comm->s->p2p, 1);
	futex_wake(&c->comm->s->p2p);
}

static ncclResult_t p2p_wait(const struct call *c, uint64_t until)
{
	for (;;) {
		uint32_t seen = atomic_load(&c->comm->s->p2p);
		if (atomic_load(p2p_counter(c, 0)) >= c->ticket)
			return ncclSuccess;
		if (now_ns() > until)
			return ncclRemoteError;
		futex_wait(&c->comm->s->p2p, seen);
	}
}

#endif
