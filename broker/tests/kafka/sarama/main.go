// Drives sarama 1.22.1 (Debian 12's golang-github-shopify-sarama-dev),
// unchanged, against Weir's Kafka listener; broker/tests/kafka_sarama.rs
// builds and runs it.
//
//	sarama-client all <bootstrap> <prefix>
//
// The topic <prefix>-records (4 partitions) must exist. The program
//
//  1. produces N keyed records with a SyncProducer (Version V1_0_0_0:
//     Produce v3 record batches, acks=all);
//  2. reads them in the consumer group <prefix>-group (sarama's defaults,
//     Version V1_0_0_0, oldest offset first), marking every record it
//     takes, and takes half of each partition's records (so N/2 in all),
//     then closes the group: the marks are committed with OffsetCommit v1,
//     which sarama sends whatever Version says;
//  3. checks those commits with a client at sarama's default Version
//     (V0_8_2_0): ConsumerMetadata (FindCoordinator v0), OffsetFetch v1;
//  4. reads the rest in a second session of the same group, which must
//     start at the committed offsets: every record read once, none missed,
//     each at the partition and offset its produce acknowledgement named;
//  5. with the default-Version client, lists the oldest and newest offsets
//     of each partition (ListOffsets v0) and fetches the group's commits
//     again: they must sum to N and equal the log ends.
//
// It prints one JSON line, with "ok":true on success, and exits non-zero
// with a message on stderr otherwise. Everything is bounded by a 60 s
// deadline.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/Shopify/sarama"
)

const (
	records    = 2000
	partitions = 4
	keys       = 100
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "sarama-client: "+format+"\n", args...)
	os.Exit(1)
}

// position is where the producer's acknowledgement placed a record.
type position struct {
	Partition int32
	Offset    int64
}

func produce(bootstrap, topic string) map[int]position {
	config := sarama.NewConfig()
	config.Version = sarama.V1_0_0_0
	config.Producer.RequiredAcks = sarama.WaitForAll
	config.Producer.Return.Successes = true
	p, err := sarama.NewSyncProducer([]string{bootstrap}, config)
	if err != nil {
		fail("NewSyncProducer: %v", err)
	}
	msgs := make([]*sarama.ProducerMessage, records)
	for i := range msgs {
		msgs[i] = &sarama.ProducerMessage{
			Topic: topic,
			Key:   sarama.StringEncoder("k" + strconv.Itoa(i%keys)),
			Value: sarama.StringEncoder(strconv.Itoa(i)),
		}
	}
	if err := p.SendMessages(msgs); err != nil {
		if errs, ok := err.(sarama.ProducerErrors); ok && len(errs) > 0 {
			fail("produce: %d of %d failed, first: %v", len(errs), records, errs[0].Err)
		}
		fail("produce: %v", err)
	}
	if err := p.Close(); err != nil {
		fail("closing the producer: %v", err)
	}
	acked := make(map[int]position, records)
	seen := make(map[position]bool, records)
	for i, m := range msgs {
		pos := position{m.Partition, m.Offset}
		if seen[pos] {
			fail("two records acknowledged at partition %d offset %d", m.Partition, m.Offset)
		}
		seen[pos] = true
		acked[i] = pos
	}
	return acked
}

// handler records what a group's sessions read, up to limit records in
// all and, when perPartition is set, up to perPartition[p] of partition p;
// records past those are neither recorded nor marked.
type handler struct {
	mu           sync.Mutex
	limit        int
	perPartition map[int32]int
	read         int
	readFrom     map[int32]int
	got          map[int]position // value -> where it was read
	dups         []int
	initial      map[int32]int64 // partition -> the claim's initial offset
	first        map[int32]int64 // partition -> the first offset read
	next         map[int32]int64 // partition -> the last offset read + 1 (marked)
	done         chan struct{}
	once         sync.Once
}

func newHandler(limit int, perPartition map[int32]int) *handler {
	return &handler{
		limit:        limit,
		perPartition: perPartition,
		readFrom:     make(map[int32]int),
		got:          make(map[int]position),
		initial:      make(map[int32]int64),
		first:        make(map[int32]int64),
		next:         make(map[int32]int64),
		done:         make(chan struct{}),
	}
}

func (h *handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *handler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	h.mu.Lock()
	if _, ok := h.initial[claim.Partition()]; !ok {
		h.initial[claim.Partition()] = claim.InitialOffset()
	}
	h.mu.Unlock()
	for msg := range claim.Messages() {
		h.mu.Lock()
		if h.read >= h.limit {
			// Read but neither counted nor marked: the next session reads it.
			h.mu.Unlock()
			h.once.Do(func() { close(h.done) })
			return nil
		}
		if most, ok := h.perPartition[msg.Partition]; ok && h.readFrom[msg.Partition] >= most {
			// Likewise; returning would end the session, so drain instead.
			h.mu.Unlock()
			continue
		}
		v, err := strconv.Atoi(string(msg.Value))
		if err != nil {
			h.mu.Unlock()
			fail("partition %d offset %d: value %q is not a number", msg.Partition, msg.Offset, msg.Value)
		}
		if want := "k" + strconv.Itoa(v%keys); string(msg.Key) != want {
			h.mu.Unlock()
			fail("record %d has key %q, want %q", v, msg.Key, want)
		}
		if _, ok := h.got[v]; ok {
			h.dups = append(h.dups, v)
		}
		h.got[v] = position{msg.Partition, msg.Offset}
		if _, ok := h.first[msg.Partition]; !ok {
			h.first[msg.Partition] = msg.Offset
		}
		h.next[msg.Partition] = msg.Offset + 1
		h.read++
		h.readFrom[msg.Partition]++
		sess.MarkMessage(msg, "")
		full := h.read >= h.limit
		h.mu.Unlock()
		if full {
			h.once.Do(func() { close(h.done) })
			return nil
		}
	}
	return nil
}

// consume runs sessions of the group until h has read its limit; the last
// session ends (committing its marks) and the group is closed.
func consume(ctx context.Context, bootstrap, group, topic string, h *handler) {
	config := sarama.NewConfig()
	config.Version = sarama.V1_0_0_0
	config.Consumer.Offsets.Initial = sarama.OffsetOldest
	g, err := sarama.NewConsumerGroup([]string{bootstrap}, group, config)
	if err != nil {
		fail("NewConsumerGroup %s: %v", group, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-h.done:
		case <-ctx.Done():
		}
		cancel()
	}()
	for ctx.Err() == nil {
		if err := g.Consume(ctx, []string{topic}, h); err != nil {
			fail("group %s: Consume: %v", group, err)
		}
	}
	cancel()
	if err := g.Close(); err != nil {
		fail("group %s: Close: %v", group, err)
	}
	select {
	case <-h.done:
	default:
		fail("group %s: read %d of %d records before the deadline", group, h.read, h.limit)
	}
}

// committed fetches the group's committed offsets (-1: none) through a
// client at sarama's default Version: OffsetFetch v1 to the coordinator
// ConsumerMetadata v0 found.
func committed(client sarama.Client, group, topic string) []int64 {
	om, err := sarama.NewOffsetManagerFromClient(group, client)
	if err != nil {
		fail("NewOffsetManagerFromClient: %v", err)
	}
	out := make([]int64, partitions)
	for p := int32(0); p < partitions; p++ {
		pom, err := om.ManagePartition(topic, p)
		if err != nil {
			fail("OffsetFetch %s %s/%d: %v", group, topic, p, err)
		}
		// NextOffset is Consumer.Offsets.Initial, OffsetNewest (-1) by
		// default, when nothing is committed.
		out[p], _ = pom.NextOffset()
		pom.AsyncClose()
	}
	if err := om.Close(); err != nil {
		fail("closing the offset manager: %v", err)
	}
	return out
}

type report struct {
	OK              bool    `json:"ok"`
	Produced        int     `json:"produced"`
	Phase1          int     `json:"phase1"`
	Phase2          int     `json:"phase2"`
	Distinct        int     `json:"distinct"`
	Duplicates      int     `json:"duplicates"`
	Missing         int     `json:"missing"`
	CommittedPhase1 []int64 `json:"committed_phase1"`
	Phase2Initial   []int64 `json:"phase2_initial"`
	Phase2First     []int64 `json:"phase2_first"`
	Oldest          []int64 `json:"oldest"`
	Newest          []int64 `json:"newest"`
	Listed          int64   `json:"listed"`
	CommittedFinal  []int64 `json:"committed_final"`
	CommittedSum    int64   `json:"committed_sum"`
	Seconds         float64 `json:"seconds"`
}

func main() {
	if len(os.Args) != 4 || os.Args[1] != "all" {
		fmt.Fprintln(os.Stderr, "usage: sarama-client all <bootstrap> <prefix>")
		os.Exit(2)
	}
	bootstrap, prefix := os.Args[2], os.Args[3]
	topic, group := prefix+"-records", prefix+"-group"
	if os.Getenv("SARAMA_LOG") != "" {
		sarama.Logger = log.New(os.Stderr, "[sarama] ", log.Lmicroseconds)
	}
	start := time.Now()
	phase := "start"
	var phaseMu sync.Mutex
	setPhase := func(p string) { phaseMu.Lock(); phase = p; phaseMu.Unlock() }
	time.AfterFunc(60*time.Second, func() {
		phaseMu.Lock()
		defer phaseMu.Unlock()
		fail("60 s deadline passed during %s", phase)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Second)
	defer cancel()
	r := report{Produced: records}

	setPhase("produce")
	acked := produce(bootstrap, topic)

	// A client at sarama's default Version, V0_8_2_0.
	old, err := sarama.NewClient([]string{bootstrap}, sarama.NewConfig())
	if err != nil {
		fail("NewClient at the default Version: %v", err)
	}
	defer old.Close()

	// Phase 1 reads half of each partition (rounded down), so that every
	// partition has a commit to resume from in its middle.
	setPhase("group phase 1")
	perPartition := make(map[int32]int)
	for _, pos := range acked {
		perPartition[pos.Partition]++
	}
	half := make(map[int32]int)
	halfTotal := 0
	for p, n := range perPartition {
		half[p] = n / 2
		halfTotal += n / 2
	}
	h1 := newHandler(halfTotal, half)
	consume(ctx, bootstrap, group, topic, h1)
	r.Phase1 = h1.read

	setPhase("OffsetFetch v1 after phase 1")
	r.CommittedPhase1 = committed(old, group, topic)
	for p := int32(0); p < partitions; p++ {
		want := int64(-1)
		if n, ok := h1.next[p]; ok {
			want = n
		}
		if r.CommittedPhase1[p] != want {
			fail("after phase 1, partition %d: committed %d, want %d (the last offset read + 1)",
				p, r.CommittedPhase1[p], want)
		}
	}

	setPhase("group phase 2")
	h2 := newHandler(records-h1.read, nil)
	consume(ctx, bootstrap, group, topic, h2)
	r.Phase2 = h2.read

	// Phase 2 starts where phase 1's commits say.
	r.Phase2Initial = make([]int64, partitions)
	r.Phase2First = make([]int64, partitions)
	for p := int32(0); p < partitions; p++ {
		want := int64(sarama.OffsetOldest)
		if c := r.CommittedPhase1[p]; c >= 0 {
			want = c
		}
		r.Phase2Initial[p] = h2.initial[p]
		r.Phase2First[p] = -1
		if f, ok := h2.first[p]; ok {
			r.Phase2First[p] = f
		}
		if h2.initial[p] != want {
			fail("phase 2, partition %d: the claim starts at %d, want %d", p, h2.initial[p], want)
		}
		if c := r.CommittedPhase1[p]; c >= 0 && r.Phase2First[p] >= 0 && r.Phase2First[p] != c {
			fail("phase 2, partition %d: first read offset %d, committed %d", p, r.Phase2First[p], c)
		}
	}

	// Every record once, at its acknowledged position.
	all := make(map[int]position, records)
	for _, h := range []*handler{h1, h2} {
		r.Duplicates += len(h.dups)
		for v, pos := range h.got {
			if _, ok := all[v]; ok {
				r.Duplicates++
			}
			all[v] = pos
		}
	}
	r.Distinct = len(all)
	var missing []int
	for v := 0; v < records; v++ {
		pos, ok := all[v]
		if !ok {
			missing = append(missing, v)
			continue
		}
		if pos != acked[v] {
			fail("record %d read at %+v, acknowledged at %+v", v, pos, acked[v])
		}
	}
	r.Missing = len(missing)
	if r.Duplicates != 0 || r.Missing != 0 {
		sort.Ints(missing)
		if len(missing) > 10 {
			missing = missing[:10]
		}
		fail("read %d distinct records, %d duplicates, %d missing (first: %v)",
			r.Distinct, r.Duplicates, r.Missing, missing)
	}

	setPhase("ListOffsets v0")
	r.Oldest = make([]int64, partitions)
	r.Newest = make([]int64, partitions)
	for p := int32(0); p < partitions; p++ {
		if r.Oldest[p], err = old.GetOffset(topic, p, sarama.OffsetOldest); err != nil {
			fail("ListOffsets v0 earliest %s/%d: %v", topic, p, err)
		}
		if r.Newest[p], err = old.GetOffset(topic, p, sarama.OffsetNewest); err != nil {
			fail("ListOffsets v0 latest %s/%d: %v", topic, p, err)
		}
		if r.Oldest[p] != 0 || r.Newest[p] != int64(perPartition[p]) {
			fail("partition %d: offsets [%d, %d), %d records acknowledged there",
				p, r.Oldest[p], r.Newest[p], perPartition[p])
		}
		r.Listed += r.Newest[p] - r.Oldest[p]
	}
	if r.Listed != records {
		fail("ListOffsets v0: %d records in all, want %d", r.Listed, records)
	}

	setPhase("OffsetFetch v1 after phase 2")
	r.CommittedFinal = committed(old, group, topic)
	for p := int32(0); p < partitions; p++ {
		if r.CommittedFinal[p] != r.Newest[p] {
			fail("partition %d: committed %d, log end %d", p, r.CommittedFinal[p], r.Newest[p])
		}
		r.CommittedSum += r.CommittedFinal[p]
	}

	r.OK = true
	r.Seconds = time.Since(start).Seconds()
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
}
