import Testing

@testable import GuidedAccessService

@Suite struct CredentialCacheTests {
    @Test func keepsWhatWasStoredPerName() {
        var cache = CredentialCache(capacity: 4)
        cache[":1.5"] = CallerCredentials(uid: 1000, pid: 42)
        cache[":1.6"] = CallerCredentials(uid: 0, pid: 7)
        #expect(cache[":1.5"]?.uid == 1000)
        #expect(cache[":1.5"]?.pid == 42)
        #expect(cache[":1.6"]?.uid == 0)
        #expect(cache[":1.7"] == nil)
    }

    @Test func dropsTheOldestBeyondItsCapacity() {
        var cache = CredentialCache(capacity: 3)
        for n in 1...5 { cache[":1.\(n)"] = CallerCredentials(uid: UInt32(n)) }
        #expect(cache.count == 3)
        #expect(cache[":1.1"] == nil)
        #expect(cache[":1.2"] == nil)
        #expect(cache[":1.3"]?.uid == 3)
        #expect(cache[":1.5"]?.uid == 5)
    }

    @Test func replacingAnEntryDoesNotEvictAnother() {
        var cache = CredentialCache(capacity: 2)
        cache[":1.1"] = CallerCredentials(uid: 1)
        cache[":1.2"] = CallerCredentials(uid: 2)
        cache[":1.2"] = CallerCredentials(uid: 22)
        #expect(cache.count == 2)
        #expect(cache[":1.1"]?.uid == 1)
        #expect(cache[":1.2"]?.uid == 22)
    }

    @Test func removingAnEntryFreesItsPlace() {
        var cache = CredentialCache(capacity: 2)
        cache[":1.1"] = CallerCredentials(uid: 1)
        cache[":1.2"] = CallerCredentials(uid: 2)
        cache[":1.1"] = nil
        cache[":1.3"] = CallerCredentials(uid: 3)
        #expect(cache.count == 2)
        #expect(cache[":1.2"]?.uid == 2)
        #expect(cache[":1.3"]?.uid == 3)
    }
}
