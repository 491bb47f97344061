import DBus
import Testing

@testable import GuidedAccessService

@Suite struct CredentialCacheTests {
    @Test func keepsWhatWasStoredPerName() {
        var cache = CredentialCache(capacity: 4)
        cache[":1.5"] = Credentials(unixUserID: 1000, processID: 42)
        cache[":1.6"] = Credentials(unixUserID: 0, processID: 7)
        #expect(cache[":1.5"]?.unixUserID == 1000)
        #expect(cache[":1.5"]?.processID == 42)
        #expect(cache[":1.6"]?.unixUserID == 0)
        #expect(cache[":1.7"] == nil)
    }

    @Test func dropsTheOldestBeyondItsCapacity() {
        var cache = CredentialCache(capacity: 3)
        for n in 1...5 { cache[":1.\(n)"] = Credentials(unixUserID: UInt32(n)) }
        #expect(cache.count == 3)
        #expect(cache[":1.1"] == nil)
        #expect(cache[":1.2"] == nil)
        #expect(cache[":1.3"]?.unixUserID == 3)
        #expect(cache[":1.5"]?.unixUserID == 5)
    }

    @Test func replacingAnEntryDoesNotEvictAnother() {
        var cache = CredentialCache(capacity: 2)
        cache[":1.1"] = Credentials(unixUserID: 1)
        cache[":1.2"] = Credentials(unixUserID: 2)
        cache[":1.2"] = Credentials(unixUserID: 22)
        #expect(cache.count == 2)
        #expect(cache[":1.1"]?.unixUserID == 1)
        #expect(cache[":1.2"]?.unixUserID == 22)
    }

    @Test func removingAnEntryFreesItsPlace() {
        var cache = CredentialCache(capacity: 2)
        cache[":1.1"] = Credentials(unixUserID: 1)
        cache[":1.2"] = Credentials(unixUserID: 2)
        cache[":1.1"] = nil
        cache[":1.3"] = Credentials(unixUserID: 3)
        #expect(cache.count == 2)
        #expect(cache[":1.2"]?.unixUserID == 2)
        #expect(cache[":1.3"]?.unixUserID == 3)
    }
}
